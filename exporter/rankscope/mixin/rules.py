"""The rule file (``{"groups": [...]}``), assembled from the areas in rankscope.mixin.alerts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankscope.mixin.alerts import census, corridor, exporter, nccl, oom, promql
from rankscope.mixin.config import Config, merged

AREAS = (corridor, census, nccl, oom, exporter)
ALERTING_GROUP = "rankscope.alerts"
# The alerts whose `for:` is minutes, evaluated every `slowAlertsInterval`: Prometheus expands
# every template of every active alert at each evaluation of its group (AlertingRule.Eval), a
# cost at fleet scale that these need not pay every 15 s (docs/performance.md).
SLOW_ALERTING_GROUP = "rankscope.alerts.slow"


def _recording(rules: Mapping[str, str], c: Config) -> list[dict[str, Any]]:
    return [{"record": name, "expr": promql(expr, c)} for name, expr in rules.items()]


def build(config: Config | None = None) -> dict[str, Any]:
    """The rule-file document for ``config`` (overrides of config.DEFAULTS)."""
    c = merged(config)
    alerts = [alert for area in AREAS for alert in area.ALERTS]
    return {
        "groups": [
            {"name": "rankscope.rules", "rules": _recording(corridor.RECORDING, c)},
            # The census rules in a group of their own: evaluated concurrently with the others,
            # so their cost at fleet scale never delays the corridor rules or the alerts.
            {"name": "rankscope.census", "rules": _recording(census.RECORDING, c)},
            {"name": ALERTING_GROUP, "rules": [a.rule(c) for a in alerts if not a.slow]},
            {
                "name": SLOW_ALERTING_GROUP,
                "interval": str(c["slowAlertsInterval"]),
                "rules": [a.rule(c) for a in alerts if a.slow],
            },
        ]
    }
