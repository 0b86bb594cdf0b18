"""Cards: identity, free memory, the corridor floor and its breaches, the memory identity,
device errors, and the sampler's own cost."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.registry import Collector, add, counter, gauge, info, label_values, summary
from rankscope.daemon.sampler import Sampler
from rankscope.daemon.sources import Sources

NAME = "cards"
HELP = "card memory, corridor floor and breaches"
DEFAULT = True


def build(config: DaemonConfig, sources: Sources) -> Collector:
    sampler = sources.sampler()
    return Collector(NAME, lambda: collect(sampler))


def collect(sampler: Sampler) -> Iterator[Metric]:
    views = sampler.views()
    gpu_info = info("rankscope_gpu_info")
    total = gauge("rankscope_gpu_total_bytes")
    free = gauge("rankscope_gpu_free_bytes")
    free_min = gauge("rankscope_gpu_free_min_bytes")
    floor = gauge("rankscope_corridor_floor_bytes")
    breach_seconds = counter("rankscope_corridor_breach_seconds_total")
    breaches = counter("rankscope_corridor_breaches_total")
    errors = counter("rankscope_device_errors_total")
    rank_resident = gauge("rankscope_gpu_rank_resident_bytes")
    foreign = gauge("rankscope_gpu_foreign_bytes")
    unattributed = gauge("rankscope_gpu_unattributed_bytes")
    for v in views:
        card = label_values(v.identity.index, v.identity.uuid)
        gpu_info.add_metric(
            label_values(v.identity.index, v.identity.uuid, v.identity.model, v.source), {}
        )
        add(total, card, v.identity.total)
        add(free, card, v.free)
        add(free_min, card, v.free_min)
        add(floor, card, v.floor)
        add(breach_seconds, card, v.breach_seconds)
        add(breaches, card, v.breaches)
        add(errors, [sampler.source.name, *card], v.errors)
        held = v.holdings
        add(rank_resident, card, held.rank_resident if held else None)
        add(foreign, card, held.foreign if held else None)
        add(unattributed, card, held.unattributed if held else None)
    add(errors, [sampler.source.name, "", ""], sampler.source_errors)
    duration = summary("rankscope_sampler_duration_seconds")
    duration.add_metric([], count_value=sampler.samples, sum_value=sampler.duration_sum)
    overruns = counter("rankscope_sampler_overruns_total")
    overruns.add_metric([], sampler.overrun_count)
    yield from (gpu_info, total, free, free_min, floor, breach_seconds, breaches, errors)
    yield from (rank_resident, foreign, unattributed, duration, overruns)
