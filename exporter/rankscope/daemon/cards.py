"""The daemon's card side: flags, and :class:`CardMonitor`, which runs the corridor sampler
and the holdings reader on their own threads and hands the server its collectors, the body
of GET /api/v1/cards and the up state of the device source.

    monitor = CardMonitor.from_args(args, rank_processes=flight.rank_processes)
    monitor.start()
    registry.add(*monitor.collectors())   # cards, holdings
    ...
    monitor.stop()
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from rankscope.daemon.collectors.cards import CardsCollector
from rankscope.daemon.collectors.holdings import HoldingsCollector
from rankscope.daemon.devices import DeviceSource, make_source
from rankscope.daemon.flags import argtype, parse_duration, positive_int
from rankscope.daemon.flightstate import RankProcess
from rankscope.daemon.holdings import HoldingsReader
from rankscope.daemon.oom import DEFAULT_EXHAUSTED_BELOW, ExhaustionWatch
from rankscope.daemon.registry import Collector
from rankscope.daemon.sampler import (
    CardView,
    Floors,
    FloorValue,
    Sampler,
    parse_floor_value,
    parse_floors,
)

log = logging.getLogger("rankscope.daemon")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cards (corridor sampler and per-pid holdings)")
    g.add_argument(
        "--corridor.floor",
        dest="corridor_floor",
        action="append",
        type=argtype(parse_floors),
        metavar="SPEC",
        help="free-memory floor: '2GiB' for every card, '0=2GiB,GPU-abc=3GiB' per card "
        "index or uuid, '5%%' of the card's total; repeatable. No floor: no breach counting",
    )
    g.add_argument(
        "--sampler.interval",
        dest="sampler_interval",
        type=argtype(parse_duration),
        default=0.1,
        metavar="DURATION",
        help="corridor sample interval (default 100ms; 20ms or 10ms for a faster corridor, "
        "docs/corridor.md)",
    )
    g.add_argument(
        "--sampler.window",
        dest="sampler_window",
        type=argtype(parse_duration),
        default=15.0,
        metavar="DURATION",
        help="trailing window of rankscope_gpu_free_min_bytes (default 15s)",
    )
    g.add_argument(
        "--device.source",
        dest="device_source",
        choices=("auto", "nvml", "script"),
        default="auto",
        help="where cards are read: nvml, or a simulated script; auto = the script when "
        "--device.script is given, else nvml (default auto)",
    )
    g.add_argument(
        "--device.script",
        dest="device_script",
        metavar="FILE",
        help="JSON file of SIMULATED cards for tests and demos (docs/corridor.md)",
    )
    g.add_argument(
        "--holdings.interval",
        dest="holdings_interval",
        type=argtype(parse_duration),
        default=1.0,
        metavar="DURATION",
        help="how often the per-card process lists are read (default 1s)",
    )
    g.add_argument(
        "--holdings.max-per-card",
        dest="holdings_max_per_card",
        type=argtype(positive_int),
        default=32,
        metavar="N",
        help="most rankscope_gpu_process_bytes series per card, one of them the overflow "
        "series summing the smallest holders (default 32)",
    )
    g.add_argument(
        "--oom.free-below",
        dest="oom_free_below",
        type=argtype(parse_floor_value),
        default=parse_floor_value(DEFAULT_EXHAUSTED_BELOW),
        metavar="SIZE",
        help="a card whose free memory falls to this or less is exhausted: an OOM instant "
        "even where no allocator reports one; its holders are read once at the onset "
        f"('256MiB', or '0.5%%' of the card's total; default {DEFAULT_EXHAUSTED_BELOW})",
    )
    g.add_argument(
        "--path.procfs",
        dest="path_procfs",
        default="/proc",
        metavar="PATH",
        help="procfs mount point with the host's PID view, for matching NVML's pids to "
        "ranks (default /proc)",
    )


def _switch(args: argparse.Namespace, name: str) -> bool:
    """A --collector.<name> switch; on unless the server's switch machinery says off."""
    for attr in (f"collector.{name}", f"collector_{name}"):
        value = getattr(args, attr, None)
        if value is not None:
            return bool(value)
    return True


class CardMonitor:
    """The sampler and the holdings reader with their threads, and what the server reads."""

    def __init__(
        self,
        source: DeviceSource,
        rank_processes: Callable[[], list[RankProcess]],
        *,
        floors: Floors | None = None,
        interval: float = 0.1,
        window: float = 15.0,
        holdings_interval: float = 1.0,
        max_per_card: int = 32,
        proc: str = "/proc",
        cards: bool = True,
        holdings: bool = True,
        exhausted_below: FloorValue | None = None,
    ) -> None:
        self.sampler = Sampler(source, floors=floors, interval=interval, window=window)
        self.exhaustion: ExhaustionWatch | None = None
        if exhausted_below is not None:
            self.exhaustion = ExhaustionWatch(
                self.sampler, rank_processes, exhausted_below, proc=proc
            )
        self.holdings: HoldingsReader | None = None
        if holdings:
            self.holdings = HoldingsReader(
                self.sampler, rank_processes, interval=holdings_interval, proc=proc
            )
        self._collectors: list[Collector] = []
        if cards:
            self._collectors.append(CardsCollector(self.sampler))
        if holdings:
            self._collectors.append(HoldingsCollector(self.sampler, max_per_card))

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, rank_processes: Callable[[], list[RankProcess]]
    ) -> CardMonitor:
        """ValueError with the flag's name for an inconsistent combination."""
        floors = Floors()
        for spec in args.corridor_floor or ():
            floors = floors.merged(spec)
        return cls(
            make_source(args.device_source, args.device_script),
            rank_processes,
            floors=floors,
            interval=args.sampler_interval,
            window=args.sampler_window,
            holdings_interval=args.holdings_interval,
            max_per_card=args.holdings_max_per_card,
            proc=args.path_procfs,
            cards=_switch(args, "cards"),
            holdings=_switch(args, "holdings"),
            exhausted_below=args.oom_free_below if _switch(args, "oom") else None,
        )

    def start(self) -> None:
        """Starts the threads and returns at once; the source opens on the sampler's
        thread, so a slow or hanging NVML init never holds the daemon's start."""
        self.sampler.start()
        if self.holdings is not None:
            self.holdings.start()

    def stop(self) -> None:
        if self.holdings is not None:
            self.holdings.stop()
        self.sampler.stop()

    def collectors(self) -> list[Collector]:
        return list(self._collectors)

    def collector(self, name: str) -> Collector:
        """The collector named ``name`` (the table's factories for cards and holdings)."""
        (found,) = [c for c in self._collectors if c.name == name]
        return found

    def ready(self) -> bool:
        """The source has been tried once (whether it came up or not)."""
        return self.sampler.tried.is_set()

    def up(self) -> dict[str, bool]:
        """rankscope_up per source: the source is open and every card answers."""
        return {self.sampler.source.name: self.sampler.up()}

    def cards_json(self) -> dict[str, Any]:
        """The body of GET /api/v1/cards (docs/architecture.md): bytes as integers,
        unmeasured values null, every process listed (the metric is capped, this is not)."""
        failing = self.sampler.source_failing
        why = f"device source {self.sampler.source.name} is down: {failing}" if failing else None
        if why is None and not self.ready():
            why = "the device source has not been tried yet"
        return {"cards": [_card_json(v) for v in self.sampler.views()], "why": why}


def _card_json(v: CardView) -> dict[str, Any]:
    held = v.holdings
    return {
        "gpu": v.identity.index,
        "uuid": v.identity.uuid,
        "model": v.identity.model,
        "source": v.source,
        "total": v.identity.total,
        "free": v.free,
        "free_min": v.free_min,
        "floor": v.floor,
        "margin": v.margin,
        "breach_seconds": v.breach_seconds,
        "breaches": v.breaches,
        "rank_resident": held.rank_resident if held else None,
        "foreign": held.foreign if held else None,
        "unattributed": held.unattributed if held else None,
        "processes": [h.to_json() for h in (held.processes if held else ())],
    }
