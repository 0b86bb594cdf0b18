"""The Grafana dashboards, one module each, built from the panel helpers here: each module's
``build(c)`` returns its dashboard for the merged config ``c``, provisioned by its uid, reading
Prometheus through a ``datasource`` variable and filtered by label_values variables (host,
boot, card). Schema version 39 is what Grafana 10.4 and 11 write."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["rankscope"]
# A panel query: (PromQL, legend); an empty legend is Grafana's automatic one.
Query = tuple[str, str]


def _panel(
    kind: str, title: str, description: str, queries: Iterable[Query], width: int, **fields: Any
) -> dict:
    """A panel: head, targets (a table's instant), its ``fields``; ``_width`` for ``_layout``."""
    instant = kind == "table"
    targets = [
        {
            "datasource": DATASOURCE,
            "expr": expr,
            "refId": chr(ord("A") + n),
            "legendFormat": legend or "__auto",
            "instant": instant,
            **({"range": False, "format": "table"} if instant else {"range": True}),
        }
        for n, (expr, legend) in enumerate(queries)
    ]
    head = {"type": kind, "title": title, "description": description, "datasource": DATASOURCE}
    return {**head, "targets": targets, **fields, "_width": width}


def timeseries(
    title: str,
    description: str,
    *queries: Query,
    unit: str = "short",
    width: int = 12,
    stack: bool = False,
) -> dict:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
    if stack:
        custom.update({"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60})
    return _panel(
        "timeseries",
        title,
        description,
        queries,
        width,
        fieldConfig={"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        options={
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["min", "last"]},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
    )


def table(
    title: str,
    description: str,
    *exprs: str,
    unit: str = "short",
    width: int = 12,
    overrides: list[dict] | None = None,
) -> dict:
    """One table from several instant queries (no legends), one row per series."""
    return _panel(
        "table",
        title,
        description,
        ((expr, "") for expr in exprs),
        width,
        fieldConfig={"defaults": {"unit": unit}, "overrides": overrides or []},
        options={"showHeader": True, "cellHeight": "sm"},
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True, "job": True}}},
        ],
    )


def rate(metric: str, selector: str) -> str:
    return f"rate({metric}{{{selector}}}[$__rate_interval])"


def increase(metric: str, selector: str) -> str:
    return f"increase({metric}{{{selector}}}[$__rate_interval])"


def variable(name: str, label: str, series: str, *, include_all: bool = True) -> dict:
    """A multi-value variable: the values of label ``name`` in ``series``. Without
    ``include_all`` Grafana opens on the first value, where "All" over a fleet would draw every
    process or count series of every host."""
    query = f"label_values({series}, {name})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"rankscope-{name}", "qryType": 1},
        "refresh": 2,
        "includeAll": include_all,
        "allValue": ".*",
        "multi": True,
        "sort": 1,
        "current": {},
        "options": [],
        "hide": 0,
        "regex": "",
    }


_DATASOURCE_VARIABLE = {
    "name": "datasource",
    "label": "Data source",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "hide": 0,
    "refresh": 1,
    "regex": "",
    "options": [],
}


def _layout(panels: list[dict]) -> list[dict]:
    """Place panels left to right in rows of 24 columns, 8 rows high; number them."""
    x = y = 0
    for n, panel in enumerate(panels, start=1):
        width = panel.pop("_width")
        if x + width > 24:
            x, y = 0, y + 8
        panel.update(id=n, gridPos={"h": 8, "w": width, "x": x, "y": y})
        x += width
    return panels


def dashboard(
    uid: str, title: str, description: str, variables: list[dict], panels: list[dict]
) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": TAGS,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": TAGS, "asDropdown": True, "title": "rankscope"}],
        "templating": {"list": [_DATASOURCE_VARIABLE, *variables]},
        "panels": _layout(panels),
    }
