"""Cards: identity, free memory, the corridor floor and its breaches, the memory identity,
device errors, and the sampler's own cost."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric

from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.registry import Collector, add, counter, gauge, info, label_values, summary
from rankscope.daemon.sampler import CardView, Sampler
from rankscope.daemon.sources import Sources

NAME = "cards"
HELP = "card memory, corridor floor and breaches"
DEFAULT = True


def build(config: DaemonConfig, sources: Sources) -> Collector:
    sampler = sources.sampler()
    return Collector(NAME, lambda: collect(sampler))


# catalog name -> a card's value in it (None: unmeasured, left out)
CARD_VALUES: dict[str, Callable[[CardView], float | None]] = {
    "rankscope_gpu_total_bytes": lambda v: v.identity.total,
    "rankscope_gpu_free_bytes": lambda v: v.free,
    "rankscope_gpu_free_min_bytes": lambda v: v.free_min,
    "rankscope_corridor_floor_bytes": lambda v: v.floor,
    "rankscope_corridor_breach_seconds_total": lambda v: v.breach_seconds,
    "rankscope_corridor_breaches_total": lambda v: v.breaches,
    # The holdings' figures are unmeasured until the first read of the card's processes.
    "rankscope_gpu_rank_resident_bytes": lambda v: v.holdings.rank_resident if v.holdings else None,
    "rankscope_gpu_foreign_bytes": lambda v: v.holdings.foreign if v.holdings else None,
    "rankscope_gpu_unattributed_bytes": lambda v: v.holdings.unattributed if v.holdings else None,
}


def collect(sampler: Sampler) -> Iterator[Metric]:
    gpu_info = info("rankscope_gpu_info")
    fams = {name: counter(name) if name.endswith("_total") else gauge(name) for name in CARD_VALUES}
    errors = counter("rankscope_device_errors_total")
    for v in sampler.views():
        card = label_values(v.identity.index, v.identity.uuid)
        gpu_info.add_metric([*card, *label_values(v.identity.model, v.source)], {})
        for name, read in CARD_VALUES.items():
            add(fams[name], card, read(v))
        add(errors, [sampler.source.name, *card], v.errors)
    add(errors, [sampler.source.name, "", ""], sampler.source_errors)
    duration = summary("rankscope_sampler_duration_seconds")
    duration.add_metric([], count_value=sampler.samples, sum_value=sampler.duration_sum)
    overruns = counter("rankscope_sampler_overruns_total")
    overruns.add_metric([], sampler.overrun_count)
    yield from (gpu_info, *fams.values(), errors, duration, overruns)
