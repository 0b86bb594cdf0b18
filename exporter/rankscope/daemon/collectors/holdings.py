"""Holdings: bytes per card and process, capped per card with one overflow series, and each
card's largest foreign holder (one series per card for the alert)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.holdings import cap
from rankscope.daemon.registry import Collector, add, gauge
from rankscope.daemon.sampler import Sampler
from rankscope.daemon.sources import Sources
from rankscope.reports.oom import ROLE_FOREIGN

NAME = "holdings"
HELP = "per-process bytes on each card"
DEFAULT = True


def build(config: DaemonConfig, sources: Sources) -> Collector:
    sources.holdings()  # the reader that fills the sampler's holdings
    sampler = sources.sampler()
    return Collector(NAME, lambda: collect(sampler, config.cards.max_per_card))


def collect(sampler: Sampler, max_per_card: int) -> Iterator[Metric]:
    fam = gauge("rankscope_gpu_process_bytes")
    largest = gauge("rankscope_gpu_largest_foreign_bytes")
    for v in sampler.views():
        if v.holdings is None:
            continue
        card = (v.identity.index, v.identity.uuid)
        for h in cap(list(v.holdings.processes), max_per_card):
            add(fam, (*card, h.pid, h.comm, h.role, h.boot, h.rank), h.bytes)
        held = v.holdings.processes
        foreign = [h for h in held if h.role == ROLE_FOREIGN and h.bytes is not None]
        if foreign:
            # The most bytes; among equals, the lowest pid, so the series stays put.
            top = max(foreign, key=lambda h: (h.bytes, -(h.pid or 0)))
            add(largest, (*card, top.pid, top.comm), top.bytes)
    yield from (fam, largest)
