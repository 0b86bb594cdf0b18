"""The daemon's configuration: the flags of `rankscope serve` as rankscope.daemon.cli parsed
them; a collector's own flags land in its ``Options`` (``options_of``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from rankscope.daemon.flightstate import EXITED_GRACE_S, READ_BUDGET_BYTES
from rankscope.daemon.oom import DEFAULT_EXHAUSTED_BELOW
from rankscope.daemon.sampler import Floors, FloorValue, parse_floor_value

DEFAULT_PORT = 19400
OOM_FREE_BELOW = parse_floor_value(DEFAULT_EXHAUSTED_BELOW)
T = TypeVar("T")


@dataclass(frozen=True)
class WebSection:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    config_file: Path | None = None  # --web.config.file: TLS, basic auth, headers


@dataclass(frozen=True)
class FlightSection:
    dir: Path
    exited_grace: float = EXITED_GRACE_S
    read_budget: int = READ_BUDGET_BYTES


@dataclass(frozen=True)
class CardsSection:
    floors: Floors = field(default_factory=Floors)
    interval: float = 0.1
    window: float = 15.0
    device_source: str = "auto"  # auto, nvml, script
    device_script: str | None = None
    holdings_interval: float = 1.0
    max_per_card: int = 32  # process series per card (holdings and OOM holders)
    oom_free_below: FloorValue = OOM_FREE_BELOW


@dataclass(frozen=True)
class OtlpSection:
    endpoint: str | None = None
    interval: float | None = None  # None: OTEL_METRIC_EXPORT_INTERVAL, else 15s


@dataclass(frozen=True)
class DaemonConfig:
    flight: FlightSection
    web: WebSection = WebSection()
    cards: CardsSection = CardsSection()
    otlp: OtlpSection = OtlpSection()
    procfs: str = "/proc"  # the host's PID view
    log_level: str = "info"
    collectors: frozenset[str] | None = None  # switched on, by name; None: each one's DEFAULT
    options: Mapping[type[Any], Any] = field(default_factory=dict)

    def enabled(self, name: str, default: bool | None) -> bool:
        """Whether a collector runs: always when it has no switch (``default`` None)."""
        if default is None:
            return True
        return default if self.collectors is None else name in self.collectors

    def options_of(self, kind: type[T]) -> T:
        """A collector's options: as its flags set them, else its defaults."""
        return cast(T, self.options.get(kind) or kind())
