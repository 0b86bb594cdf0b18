"""The holdings collector: rankscope_gpu_process_bytes per card and process, role rank
(matched to a rank's record) or foreign, capped per card with one overflow series. Series
of exited processes vanish with the next process-list read."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from rankscope.daemon.holdings import cap
from rankscope.daemon.registry import add, gauge
from rankscope.daemon.sampler import Sampler


class HoldingsCollector:
    name = "holdings"

    def __init__(self, sampler: Sampler, max_per_card: int = 32) -> None:
        if max_per_card < 1:
            raise ValueError("--holdings.max-per-card must be at least 1")
        self.sampler = sampler
        self.max_per_card = max_per_card

    def collect(self) -> Iterator[Metric]:
        fam = gauge("rankscope_gpu_process_bytes")
        for v in self.sampler.views():
            if v.holdings is None:
                continue
            for h in cap(list(v.holdings.processes), self.max_per_card):
                labels = (v.identity.index, v.identity.uuid, h.pid, h.comm, h.role, h.boot, h.rank)
                add(fam, labels, h.bytes)
        yield fam
