"""OTLP push of the catalog, fed by the collectors Prometheus scrapes; the resource carries
the newest boot, and the provider is rebuilt when it changes."""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from rankscope import __version__, catalog
from rankscope.daemon.registry import TimedCollectors
from rankscope.daemon.sampler import Periodic

if TYPE_CHECKING:  # imported where used: a daemon without OTLP never loads opentelemetry
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider

log = logging.getLogger("rankscope.daemon")

UCUM_UNITS = {"bytes": "By", "seconds": "s", "": ""}
ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
ENV_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"  # milliseconds, as the OTel spec has it


def instrument_names(metric: catalog.Metric) -> list[tuple[str, str]]:
    """(OTel instrument name, sample name in the exposition) pairs for one catalog entry."""
    if metric.type == "summary":
        return [(metric.name + part, metric.name + part) for part in ("_count", "_sum")]
    return [(metric.family if metric.type == "counter" else metric.name, metric.name)]


def otlp_configured(endpoint_flag: str | None) -> bool:
    env = os.environ
    return bool(endpoint_flag or env.get(ENV_ENDPOINT) or env.get(ENV_METRICS_ENDPOINT))


def default_interval() -> float:
    """Seconds between pushes: OTEL_METRIC_EXPORT_INTERVAL when set, else 15 s (a scrape
    interval, not the SDK's 60 s: a corridor breach is news)."""
    raw = os.environ.get(ENV_INTERVAL)
    if raw:
        try:
            return float(raw) / 1000.0
        except ValueError:
            log.warning("ignoring %s=%r: not a number of milliseconds", ENV_INTERVAL, raw)
    return 15.0


class OtlpPusher:
    def __init__(
        self,
        collectors: TimedCollectors,
        latest_boot: Callable[[], str | None],
        *,
        endpoint: str | None = None,
        interval: float = 15.0,
    ) -> None:
        self.collectors = collectors
        self.latest_boot = latest_boot
        self.endpoint = endpoint
        self.interval = interval
        self.host = socket.gethostname()
        self._provider: MeterProvider | None = None
        self._boot: str | None = None
        self._watcher = Periodic("rankscope-otlp", interval, self._watch, stop_wait=5.0)
        self._lock = threading.Lock()
        self._taken = -math.inf
        self._samples: dict[str, list[Observation]] = {}

    def _observe(self, sample_name: str, _options: CallbackOptions) -> list[Observation]:
        """One collection serves every instrument of one export, not one per callback."""
        from opentelemetry.metrics import Observation

        with self._lock:
            now = time.monotonic()
            if now - self._taken > min(1.0, self.interval / 2):
                taken: dict[str, list[Observation]] = defaultdict(list)
                for family in self.collectors.collect():
                    for s in family.samples:
                        # An empty label value is an absent label in Prometheus; OTel drops it too.
                        attrs = {k: v for k, v in s.labels.items() if v != ""}
                        taken[s.name].append(Observation(float(s.value), attrs))
                self._samples, self._taken = taken, now
            return self._samples.get(sample_name, [])

    def start(self) -> None:
        self._boot = self.latest_boot()
        self._provider = self._build(self._boot)
        self._watcher.start()

    def stop(self) -> None:
        self._watcher.stop()
        if self._provider is not None:
            self._provider.shutdown()  # flushes one last export
            self._provider = None

    def _build(self, boot: str | None) -> MeterProvider:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        # No --otlp.endpoint: the exporter reads OTEL_EXPORTER_OTLP_* from the environment.
        endpoint = None if self.endpoint is None else self.endpoint.rstrip("/") + "/v1/metrics"
        exporter = OTLPMetricExporter(endpoint=endpoint)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=self.interval * 1e3)
        # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME.
        attributes = {
            "service.name": "rankscope",
            "service.version": __version__,
            "host.name": self.host,
        }
        if boot is not None:  # no record yet: no boot, rather than an empty one
            attributes["rankscope.boot"] = boot
        provider = MeterProvider(resource=Resource.create(attributes), metric_readers=[reader])
        meter = provider.get_meter("rankscope", __version__)
        for metric in catalog.CATALOG:
            unit = UCUM_UNITS.get(metric.unit, metric.unit)
            counts = metric.type in ("counter", "summary")
            create = meter.create_observable_counter if counts else meter.create_observable_gauge
            for name, sample_name in instrument_names(metric):
                observe = functools.partial(self._observe, sample_name)
                create(name, [observe], unit=unit, description=metric.help)
        return provider

    def _watch(self) -> None:
        boot = self.latest_boot()
        if boot != self._boot and self._provider is not None:
            log.info("newest boot is now %s: OTLP resource updated", boot)
            old, self._provider = self._provider, self._build(boot)
            self._boot = boot
            old.shutdown()
