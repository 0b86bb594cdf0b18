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

    def line(self, text: str) -> None:
        self.out.write(f"[{time.monotonic() - self.t0:6.1f}s] {text}\n")
        self.out.flush()

    def block(self, lines: list[str]) -> None:
        for text in lines:
            self.line(text)

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


def card_lines(cards_doc: dict[str, Any], worst: dict[str, int] | None = None) -> list[str]:
    """Per card: the latest sample, then the last holdings scan with that scan's free bytes."""
    lines = []
    for card in cards_doc.get("cards", []):
        tag = " (simulated card)" if card.get("source") == "simulated" else ""
        procs = card.get("processes") or []
        ranks = [p for p in procs if p.get("role") == "rank"]
        foreign = [
            f"pid {p.get('pid')} {p.get('comm') or '(exited)'} {gib(p.get('bytes'))}"
            for p in procs
            if p.get("role") == "foreign"
        ]
        uuid = card.get("uuid")
        if worst is not None and isinstance(uuid, str) and uuid in worst:
            low = f"worst this scenario {gib(worst[uuid])}"
        else:
            low = f"worst in the daemon's window {gib(card.get('free_min'))}"
        held = [card.get(k) for k in ("rank_resident", "foreign", "unattributed")]
        total = card.get("total")
        measured = isinstance(total, int) and all(isinstance(h, int) for h in held)
        scan_free = total - sum(held) if measured else None
        lines.append(
            f"  gpu {card.get('gpu')}{tag}: now free {gib(card.get('free'))} ({low}), "
            f"floor {gib(card.get('floor'))}, "
            f"margin over the daemon's window {gib(card.get('margin'), signed=True)}, "
            f"breaches {card.get('breaches', 'n/a')}; last holdings scan: ranks {len(ranks)} "
            f"holding {gib(card.get('rank_resident'))}, foreign: {', '.join(foreign) or 'none'}, "
            f"free {gib(scan_free)}"
        )
    return lines or ["  no cards reported yet"]
