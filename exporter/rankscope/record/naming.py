"""Names the census gives what it counts, shared by the counting ranks and the readers:
group instances (``tp:0-3``) and point-to-point ops (``send>3``, ``recv<0``)."""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterable

log = logging.getLogger("rankscope.census")

Key = tuple[str, str]  # (group instance, op)


def compact_ranks(ranks: Iterable[int]) -> str:
    """Sorted ranks as runs: [0, 1, 2, 3] -> '0-3'; [0, 4] -> '0,4'; [0, 1, 2, 5] -> '0-2,5'."""
    parts = []
    for _, pairs in itertools.groupby(enumerate(sorted(set(ranks))), lambda p: p[1] - p[0]):
        run = [r for _, r in pairs]
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def group_instance(name: str, ranks: Iterable[int]) -> str:
    """``{name}:{ranks}``, e.g. ``tp:4-7`` for the TP group of PP stage 1; once per group."""
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


# A send and a recv are not the same op on both ends, so p2p ops carry the peer's global
# rank: rank a counts "send>b", rank b counts "recv<a", and the comparison pairs them.
SEND = "send"
RECV = "recv"


@functools.cache
def p2p_name(kind: str, peer: int | None) -> str:
    """``send>peer`` or ``recv<peer`` (global ranks); cached: the hot path builds no string."""
    return f"{kind}{'>' if kind == SEND else '<'}{'?' if peer is None else peer}"


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


def channel_name(src: int, dst: int) -> str:
    """The report's one name for the p2p channel from global rank ``src`` to ``dst``."""
    return f"p2p {src}>{dst}"


def report_op_name(rank: int, op: str) -> str:
    """``op`` as counted by ``rank``; a p2p op by its channel (``send>2`` of 0 is ``p2p 0>2``)."""
    p2p = parse_p2p(op)
    if p2p is None:
        return op
    kind, peer = p2p
    return channel_name(rank, peer) if kind == SEND else channel_name(peer, rank)
