"""The collector protocol, metric families made from the catalog (help, type and label names
never typed twice; label values in catalog order), and the registry timing every collector."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import CollectorRegistry

from rankscope import catalog

log = logging.getLogger("rankscope.daemon")

_F = TypeVar("_F", GaugeMetricFamily, CounterMetricFamily, SummaryMetricFamily, InfoMetricFamily)
_FAMILIES = {
    "gauge": GaugeMetricFamily,
    "counter": CounterMetricFamily,
    "summary": SummaryMetricFamily,
    "info": InfoMetricFamily,
}


@dataclass(frozen=True)
class Collector:
    """What a collector module's ``build`` returns; ``name`` is its ``collector`` label."""

    name: str
    collect: Callable[[], Iterable[Metric]]


def family(catalog_name: str) -> Metric:
    """A fresh, empty family for one catalog entry; KeyError for an uncatalogued name."""
    m = catalog.BY_NAME[catalog_name]
    unit = {} if m.type == "info" else {"unit": m.unit}  # an info family has no unit
    return _FAMILIES[m.type](m.family, m.help, labels=list(m.labels), **unit)


def _typed(catalog_name: str, cls: type[_F]) -> _F:
    fam = family(catalog_name)
    if not isinstance(fam, cls):
        kind = catalog.BY_NAME[catalog_name].type
        raise TypeError(f"{catalog_name} is a {kind} in the catalog, not a {cls.__name__}")
    return fam


gauge = functools.partial(_typed, cls=GaugeMetricFamily)
counter = functools.partial(_typed, cls=CounterMetricFamily)
summary = functools.partial(_typed, cls=SummaryMetricFamily)
info = functools.partial(_typed, cls=InfoMetricFamily)


def label_values(*values: object) -> list[str]:
    """Unknown (None) is the empty string, which PromQL treats as an absent label."""
    return ["" if v is None else str(v) for v in values]


def add(
    fam: GaugeMetricFamily | CounterMetricFamily, values: Sequence[object], value: float | None
) -> None:
    """Add one sample unless the value is unmeasured (None): absent, never 0."""
    if value is not None:
        fam.add_metric(label_values(*values), float(value))


class TimedCollectors:
    """Runs and times every collector (rankscope_collector_success and _duration). A
    collector that raises costs its own families for that scrape, never the scrape."""

    def __init__(
        self, collectors: Iterable[Collector] = (), refresh: Callable[[], object] | None = None
    ) -> None:
        self.collectors = list(collectors)
        names = [c.name for c in self.collectors]
        if len(set(names)) < len(names):
            raise ValueError(f"two collectors named {max(names, key=names.count)!r}")
        self._refresh = refresh  # before each collection (the daemon's tails the flight dir)
        self._warned: set[str] = set()
        self._lock = threading.Lock()  # held by the collection in progress
        self._collections = 0  # finished
        self._started: float | None = None  # of the collection in progress
        self._families: list[Metric] = []  # of the latest collection

    def collect(self) -> Iterator[Metric]:
        # A scrape that arrives while a collection runs serves that one's families (begun
        # at most one collection ago) instead of queueing for a collection of its own.
        seen = self._collections
        with self._lock:
            if self._collections == seen:
                self._families, self._started = [], time.monotonic()
                try:
                    self._families = self._collect_once()
                finally:
                    self._collections += 1
                    self._started = None
            return iter(self._families)

    def running_for(self) -> float | None:
        """Seconds the collection in progress has run; None when none runs."""
        started = self._started
        return None if started is None else time.monotonic() - started

    def _collect_once(self) -> list[Metric]:
        success = gauge("rankscope_collector_success")
        duration = gauge("rankscope_collector_duration_seconds")
        families: list[Metric] = []
        if self._refresh is not None:
            start = time.perf_counter()
            ok = self._refresh() is not False
            success.add_metric(["refresh"], float(ok))
            duration.add_metric(["refresh"], time.perf_counter() - start)
        for c in self.collectors:
            start = time.perf_counter()
            try:
                families.extend(list(c.collect()))  # whole, or none of its families
                ok = True
            except Exception as exc:
                ok = False
                if c.name not in self._warned:
                    self._warned.add(c.name)
                    log.exception("collector %s failed: %s", c.name, exc)
                else:
                    log.debug("collector %s failed again: %r", c.name, exc)
            success.add_metric([c.name], float(ok))
            duration.add_metric([c.name], time.perf_counter() - start)
        return [*families, success, duration]

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(self)
        return reg
