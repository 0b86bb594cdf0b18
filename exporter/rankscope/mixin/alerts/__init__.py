"""The alerting and recording rules, one module per area: its ``ALERTS`` and its ``RECORDING``
(name -> expression), which rankscope.mixin.rules assembles into groups.

Expressions are templates of config keys (``{selector}``) pasted in as text, so the Helm sync
can pass template references; annotations use Prometheus's templating only, never config
values, so they survive any renderer unchanged.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from rankscope.mixin.config import Config

# How a description names a card (written `<card>`): index, uuid and the daemon watching it.
CARD = "{{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"


def promql(template: str, c: Config) -> str:
    """Dedent a PromQL template and fill in config values by key as text."""
    return textwrap.dedent(template).strip().format(**{k: str(v) for k, v in c.items()})


@dataclass(frozen=True)
class Alert:
    """An alerting rule. ``for_`` names the config key of its `for:`; ``summary`` is static,
    ``description`` a Prometheus template (whitespace folded); the runbook anchor is the name
    in lower case. ``slow``: its `for:` is minutes, so it is evaluated in the slow group."""

    name: str
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    slow: bool = False

    def rule(self, c: Config) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": promql(self.expr, c),
            "for": str(c[self.for_]),
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": " ".join(self.description.replace("<card>", CARD).split()),
                "runbook_url": f"{c['runbookUrl']}#{self.name.lower()}",
            },
        }
