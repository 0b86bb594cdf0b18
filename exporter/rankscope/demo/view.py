"""The demo's terminal view: a line per event, a summary every few seconds, the verdict; plain
lines, so the output reads the same in a terminal, a CI log or a pipe."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from rankscope.demo.services import Page

GiB = 1024**3


def gib(value: Any, signed: bool = False) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "n/a"  # unmeasured: never shown as 0
    return f"{value / GiB:{'+' if signed else ''}.2f} GiB"


class View:
    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.t0 = time.monotonic()

    def line(self, *texts: str) -> None:
        stamp = f"[{time.monotonic() - self.t0:6.1f}s]"
        self.out.writelines(f"{stamp} {text}\n" for text in texts)
        self.out.flush()

    def banner(self, text: str) -> None:
        self.out.write(f"\n=== {text} ===\n")
        self.out.flush()

    def page(self, page: Page, scenario: str) -> None:
        labels = ", ".join(
            f"{k}={v}"
            for k, v in sorted(page.labels.items())
            if k not in ("alertname", "severity", "job")
        )
        what = page.annotations.get("description") or page.annotations.get("summary", "")
        self.line(
            f"PAGE {page.status.upper()} {page.alertname} [{page.labels.get('severity', '?')}] "
            f"to {page.receiver} during {scenario}: {labels}"
        )
        if page.status == "firing" and what:
            self.line(f"     {what}")


def card_lines(
    cards_doc: dict[str, Any], worst: dict[str, int], breaches_before: dict[str, int]
) -> list[str]:
    """Per card: the latest sample; this scenario's worst free, margin and breaches (the
    daemon's counter less its value when the scenario began); then the last holdings scan,
    flagged when it is older than the sample."""
    lines = []
    for card in cards_doc.get("cards", []):
        tag = " (simulated card)" if card.get("source") == "simulated" else ""
        uuid = str(card.get("uuid"))
        free, floor = card.get("free"), card.get("floor")
        low = worst.get(uuid)
        margin = low - floor if isinstance(low, int) and isinstance(floor, int) else None
        breaches = card.get("breaches")
        if isinstance(breaches, int):
            breaches -= breaches_before.get(uuid, breaches)
        lines.append(
            f"  gpu {card.get('gpu')}{tag}: free {gib(free)} now; this scenario: worst free "
            f"{gib(low)}, margin {gib(margin, signed=True)} over the {gib(floor)} floor, "
            f"breaches {breaches if isinstance(breaches, int) else 'n/a'}; {_holdings(card)}"
        )
    return lines or ["  no cards reported yet"]


def _holdings(card: dict[str, Any]) -> str:
    procs = card.get("processes") or []
    ranks = sum(1 for p in procs if p.get("role") == "rank")
    foreign = [
        f"pid {p.get('pid')} {p.get('comm') or '(exited)'} {gib(p.get('bytes'))}"
        for p in procs
        if p.get("role") == "foreign"
    ]
    parts = [card.get(k) for k in ("rank_resident", "foreign", "unattributed")]
    held = [p for p in parts if isinstance(p, int)]
    total, free = card.get("total"), card.get("free")
    text = (
        f"last holdings scan: {ranks} {'rank holds' if ranks == 1 else 'ranks hold'} "
        f"{gib(card.get('rank_resident'))} in all, foreign: {', '.join(foreign) or 'none'}"
    )
    if isinstance(total, int) and len(held) == len(parts):
        scan_free = total - sum(held)
        if scan_free != free:  # the card changed since the scan: say so, never mix them
            text += f" (the scan is older than the sample: free {gib(scan_free)} then)"
    return text
