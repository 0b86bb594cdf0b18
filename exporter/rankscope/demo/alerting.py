"""The demo's rules and routing: the mixin's rules with `for:` and windows cut for a short
demo, and the example Alertmanager routing pointed at the demo's webhook receiver."""

from __future__ import annotations

import importlib.resources
from typing import Any

import yaml

from rankscope.mixin import render

FOREIGN_HOLDER_FOR_SECONDS = 3  # how long a foreign holder stays before it pages

# Only time is shortened; thresholds, selectors and expressions are the shipped ones.
DEMO_RULES_CONFIG: dict[str, Any] = {
    "corridorBreachWindow": "30s",
    "corridorBreachFor": "0s",
    "censusSkewFor": "2s",
    "foreignHolderFor": f"{FOREIGN_HOLDER_FOR_SECONDS}s",
    "oomWindow": "30s",
    # The foreign holder's group, evaluated every minute as shipped, at the demo's 1 s.
    "slowAlertsInterval": "1s",
}

# The alerts the scenarios expect; each must be an alert of the generated rules.
CENSUS_SKEW = "RankscopeCensusSkew"
FOREIGN_HOLDER = "RankscopeForeignHolder"
CORRIDOR_BREACH = "RankscopeCorridorBreach"
OUT_OF_MEMORY = "RankscopeOutOfMemory"

# Route timings for the demo: a page within seconds, and no repeats while it runs.
DEMO_TIMINGS = {"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"}


def rules_text() -> str:
    return render.rules_yaml(DEMO_RULES_CONFIG)


EXAMPLE_ORIGIN = f"rankscope.mixin/{render.EXAMPLE_ROUTING}"


def example_routing() -> str:
    """The shipped Alertmanager example, packaged with rankscope.mixin."""
    return importlib.resources.files("rankscope.mixin").joinpath(render.EXAMPLE_ROUTING).read_text()


def demo_routing(example_text: str, webhook_url: str) -> str:
    """The example routing, every integration a webhook to ``webhook_url``, timings cut."""
    doc = yaml.safe_load(example_text)
    if not isinstance(doc, dict) or not isinstance(doc.get("route"), dict):
        raise ValueError("the example Alertmanager configuration has no route")
    for receiver in doc.get("receivers") or []:
        for key in [k for k in receiver if k.endswith("_configs")]:
            configs = receiver.pop(key) or []
            receiver.setdefault("webhook_configs", []).extend(
                {"url": webhook_url, "send_resolved": c.get("send_resolved", True)} for c in configs
            )
    _shorten(doc["route"], top=True)
    return yaml.safe_dump(doc, sort_keys=False)


def _shorten(route: dict[str, Any], *, top: bool) -> None:
    for key, value in DEMO_TIMINGS.items():
        if top or key in route:
            route[key] = value
    for child in route.get("routes") or []:
        _shorten(child, top=False)
