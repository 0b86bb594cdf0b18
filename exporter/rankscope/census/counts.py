"""The census counters: one dict increment per collective, keyed by (group instance, op).

RANKSCOPE_CENSUS is read once, at import: when it disarms the census, ``count`` is a
function that does nothing, so the hot path never tests a flag. A group instance names its
member ranks (``tp:0-3``), so only members of the same instance are ever compared.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Iterable
from typing import Any

from rankscope.schema import encode_counts as encode_counts

log = logging.getLogger("rankscope.census")

ENV_CENSUS = "RANKSCOPE_CENSUS"

Key = tuple[str, str]  # (group instance, op)

ARMED: bool = os.environ.get(ENV_CENSUS, "1").strip().lower() not in ("0", "false", "off", "no")

# Every collective this process issued, per (group instance, op); replays of captured CUDA
# graphs included. Written only by count() and the graph replay; read by copying.
COUNTS: collections.defaultdict[Key, int] = collections.defaultdict(int)

# Calls that could not be counted (an unhashable group, a non-numeric n): counted, not raised.
failed_counts = 0


def _count_failed(group: Any, op: Any, exc: BaseException) -> None:
    global failed_counts
    failed_counts += 1
    if failed_counts == 1:
        log.warning(
            "rankscope census: could not count (%r, %r): %r; further failures are counted silently",
            group,
            op,
            exc,
        )


if ARMED:

    def count(group: str, op: str, n: int = 1) -> None:
        """Count ``n`` calls of collective ``op`` on group instance ``group`` (a name from
        :func:`group_instance`). The hot path: one dict increment, never raises."""
        try:
            COUNTS[group, op] += n
        except Exception as exc:  # an unhashable group must not reach the host program
            _count_failed(group, op, exc)

else:

    def count(group: str, op: str, n: int = 1) -> None:
        """Disarmed by RANKSCOPE_CENSUS=0: counts nothing."""


def snapshot() -> dict[Key, int]:
    """A consistent copy of the counts (the C-level copy holds the GIL throughout)."""
    return dict(COUNTS)


def reset() -> None:
    """Forget every count (tests, or a framework that re-initialises its groups)."""
    COUNTS.clear()


# --- group instance names -----------------------------------------------------------------


def compact_ranks(ranks: Iterable[int]) -> str:
    """Sorted ranks as runs: [0, 1, 2, 3] -> '0-3'; [0, 4] -> '0,4'; [0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def group_instance(name: str, ranks: Iterable[int]) -> str:
    """The name of a group instance: ``{name}:{ranks}``, e.g. ``tp:0-3`` for the TP group of
    PP stage 0 and ``tp:4-7`` for stage 1. Call it once per group, not per collective."""
    try:
        spec = compact_ranks(int(r) for r in ranks)
    except (TypeError, ValueError) as exc:
        log.warning("rankscope census: group %r has unreadable ranks (%r)", name, exc)
        spec = ""
    return f"{name}:{spec or '?'}"


def parse_instance(instance: str) -> tuple[str, tuple[int, ...]] | None:
    """'tp:0-3' -> ('tp', (0, 1, 2, 3)); None when the name carries no rank list."""
    name, sep, spec = instance.rpartition(":")
    if not sep or not spec:
        return None
    ranks: list[int] = []
    try:
        for part in spec.split(","):
            first, dash, last = part.partition("-")
            lo = int(first)
            hi = int(last) if dash else lo
            if hi < lo or lo < 0:
                return None
            ranks.extend(range(lo, hi + 1))
    except ValueError:
        return None
    return name, tuple(sorted(set(ranks)))


# --- point-to-point ops --------------------------------------------------------------------

# A send and a recv are not the same op on both ends, so p2p ops carry the peer's global
# rank: rank a counts "send>b", rank b counts "recv<a", and the comparison pairs them.
SEND = "send"
RECV = "recv"
_P2P_NAMES: dict[tuple[str, int | None], str] = {}


def p2p_name(kind: str, peer: int | None) -> str:
    """Op name of a send to (kind 'send') or a recv from (kind 'recv') global rank ``peer``;
    cached, so the hot path builds no string."""
    key = (kind, peer)
    name = _P2P_NAMES.get(key)
    if name is None:
        mark = ">" if kind == SEND else "<"
        name = _P2P_NAMES[key] = f"{kind}{mark}{'?' if peer is None else peer}"
    return name


def parse_p2p(op: str) -> tuple[str, int] | None:
    """'send>3' -> ('send', 3); 'recv<0' -> ('recv', 0); None for any other op."""
    for kind, mark in ((SEND, ">"), (RECV, "<")):
        prefix = kind + mark
        if op.startswith(prefix):
            try:
                return kind, int(op[len(prefix) :])
            except ValueError:
                return None
    return None
