"""The OOM collector: rankscope_oom_events_total per card and failing process (probe records)
or per card alone (sampler exhaustions), and the holders of each card at its latest OOM."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.holdings import cap
from rankscope.daemon.oom import OomBook
from rankscope.daemon.registry import Collector, add, counter, gauge
from rankscope.daemon.sources import Sources

NAME = "oom"
HELP = "OOM events (the probe's and the sampler's) and the holders at each"
DEFAULT = True


def build(config: DaemonConfig, sources: Sources) -> Collector:
    book = sources.ooms()
    return Collector(NAME, lambda: collect(book, config.cards.max_per_card))


def collect(book: OomBook, max_per_card: int) -> Iterator[Metric]:
    # (gpu, uuid, boot, rank, pid): None is an empty label (no boot, rank or pid).
    counts: Counter[tuple[int | None, str | None, str | None, int | None, int | None]] = Counter()
    for st in book.state.view().streams:
        p = st.process
        pid = book.state.process_host_pid(p)
        for (gpu, uuid), n in st.oom_counts.items():
            counts[gpu, uuid, st.boot, p.rank, p.pid if pid is None else pid] += n
    if book.watch is not None:
        for (gpu, uuid), n in book.watch.counts().items():
            counts[gpu, uuid, None, None, None] += n
    events = counter("rankscope_oom_events_total")
    for labels, n in sorted(counts.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        add(events, labels, n)
    yield events
    holders = gauge("rankscope_oom_holder_bytes")
    for uuid, oom in book.latest_by_card().items():
        for h in cap(list(oom.holders or ()), max_per_card):
            add(holders, (oom.gpu, uuid, h.pid, h.comm, h.role, h.boot, h.rank), h.bytes)
    yield holders
