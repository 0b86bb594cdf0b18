"""The collectors, registered node_exporter's way: one table gives each its
``--collector.NAME`` / ``--no-collector.NAME`` switch, its factory and its gate.

Adding a collector is one :class:`Entry` in :data:`TABLE`: its name (the switch and the
``collector`` label of rankscope_collector_success), a line of help, a factory from what
the daemon has built (:class:`Inputs`), and whether it reads the card monitor (started only
when some collector that reads it is on). Order is scrape order. The flight directory is
refreshed once per scrape before any collector runs (TimedCollectors' ``refresh`` step), so
no collector tails it as a side effect.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankscope.daemon.collectors.arenas import ArenasCollector
from rankscope.daemon.collectors.census import CensusCollector
from rankscope.daemon.collectors.oom import OomCollector
from rankscope.daemon.collectors.phases import PhasesCollector
from rankscope.daemon.collectors.self import SelfCollector
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import Collector

if TYPE_CHECKING:
    from rankscope.daemon.cards import CardMonitor
    from rankscope.daemon.nccl_ras import RasPoller
    from rankscope.daemon.oom import OomBook


@dataclass(frozen=True)
class Inputs:
    """What a factory may use: the parsed flags, the flight state, the card monitor, and the
    OOM book (built when the oom collector is on; the API serves it too)."""

    args: argparse.Namespace
    state: FlightState
    monitor: CardMonitor | None
    ooms: OomBook | None = None
    ras: RasPoller | None = None  # built when the nccl-ras collector is on; the daemon runs it


@dataclass(frozen=True)
class Entry:
    name: str
    help: str
    factory: Callable[[Inputs], Collector]
    reads_cards: bool = False  # gated on the card monitor, which it reads
    switchable: bool = True  # False: always on, no switch
    default_on: bool = True  # the switch's default


def _monitor(inputs: Inputs) -> CardMonitor:
    assert inputs.monitor is not None  # the gate: reads_cards entries run with a monitor
    return inputs.monitor


def _nccl_ras(inputs: Inputs) -> Collector:
    from rankscope.daemon.collectors.nccl_ras import NcclRasCollector

    assert inputs.ras is not None  # built by the daemon whenever the collector is on
    return NcclRasCollector(inputs.ras, inputs.state)


def _ooms(inputs: Inputs) -> OomBook:
    assert inputs.ooms is not None  # built by the daemon whenever the oom collector is on
    return inputs.ooms


TABLE: tuple[Entry, ...] = (
    Entry(
        "self",
        "build info, source health, skipped flight lines",
        lambda i: SelfCollector(i.state, i.monitor.up if i.monitor is not None else None),
        switchable=False,
    ),
    Entry(
        "phases",
        "phase marks and the posts between them",
        lambda i: PhasesCollector(i.state, boots=i.args.phase_boots),
    ),
    Entry("arenas", "KV arena bytes", lambda i: ArenasCollector(i.state)),
    Entry("census", "collective counts, rounds, divergences", lambda i: CensusCollector(i.state)),
    Entry(
        "oom",
        "OOM events (the probe's and the sampler's) and the holders at each",
        lambda i: OomCollector(_ooms(i), getattr(i.args, "holdings_max_per_card", 32)),
    ),
    Entry(
        "cards",
        "card memory, corridor floor and breaches",
        lambda i: _monitor(i).collector("cards"),
        reads_cards=True,
    ),
    Entry(
        "holdings",
        "per-process bytes on each card",
        lambda i: _monitor(i).collector("holdings"),
        reads_cards=True,
    ),
    Entry(
        "nccl-ras",
        "NCCL's RAS status reports: communicators, per-rank counts, mismatches, dead peers "
        "(docs/census.md; off until proven on your NCCL)",
        _nccl_ras,
        default_on=False,
    ),
)


def add_switches(parser: argparse.ArgumentParser) -> None:
    for entry in TABLE:
        if entry.switchable:
            parser.add_argument(
                f"--collector.{entry.name}",
                dest=f"collector_{entry.name.replace('-', '_')}",
                action=argparse.BooleanOptionalAction,
                default=entry.default_on,
                help=f"the {entry.name} collector: {entry.help} "
                f"(default {'on' if entry.default_on else 'off'})",
            )


def enabled(args: argparse.Namespace, name: str) -> bool:
    default = next((e.default_on for e in TABLE if e.name == name), True)
    return bool(getattr(args, f"collector_{name.replace('-', '_')}", default))


def needs_monitor(args: argparse.Namespace) -> bool:
    """Whether any collector that reads the card monitor is on."""
    return any(e.reads_cards and enabled(args, e.name) for e in TABLE)


def build(inputs: Inputs) -> list[Collector]:
    """The enabled collectors whose gate is open, in table order."""
    return [
        entry.factory(inputs)
        for entry in TABLE
        if (not entry.switchable or enabled(inputs.args, entry.name))
        and (not entry.reads_cards or inputs.monitor is not None)
    ]
