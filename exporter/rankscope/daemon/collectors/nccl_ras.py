"""NCCL RAS: what the endpoints last reported (the poller's state, never a connection in
the scrape path), mapped to rankscope boots and ranks where unambiguous (docs/census.md,
"NCCL RAS"): a (host, pid) to the one (boot, rank) with that pid, newest boot first."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from rankscope.catalog import CATALOG
from rankscope.daemon import nccl_ras
from rankscope.daemon.flags import argtype, parse_duration
from rankscope.daemon.flightstate import FlightState, FlightView
from rankscope.daemon.nccl_ras import Endpoint, pollers
from rankscope.daemon.nccl_ras_report import ERROR_REASONS, Communicator, MissingRank, RasRank
from rankscope.daemon.registry import Collector, add, counter, gauge, info, label_values

if TYPE_CHECKING:
    import argparse

    from rankscope.daemon.config import DaemonConfig
    from rankscope.daemon.sources import Sources

NAME = "nccl-ras"
HELP = (
    "NCCL's RAS status reports: communicators, per-rank counts, mismatches, dead peers "
    "(docs/census.md; off until proven on your NCCL)"
)
DEFAULT = False

Identity = tuple[str, int | None]  # (boot, rankscope rank)


@dataclass(frozen=True)
class Options:
    nccl_ras_address: tuple[str, ...] | None = None
    nccl_ras_interval: float = 15.0
    nccl_ras_persist_polls: int = nccl_ras.DEFAULT_PERSIST_POLLS
    nccl_ras_timeout: float = nccl_ras.REPORT_TIMEOUT_S
    nccl_ras_max_bytes: int = nccl_ras.DEFAULT_MAX_BYTES


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("nccl-ras (NCCL's RAS status reports, docs/census.md)")
    add = group.add_argument
    add("--collector.nccl-ras.address", dest="nccl_ras_address", action="append",
        metavar="HOST:PORT",
        help=f"RAS endpoint (NCCL_RAS_ADDR of a job); repeatable, one per job: jobs that "
        f"share the default port answer in turn (SO_REUSEPORT). Default {nccl_ras.DEFAULT_ADDRESS}")  # fmt: skip
    add("--collector.nccl-ras.interval", dest="nccl_ras_interval", type=argtype(parse_duration),
        default=Options.nccl_ras_interval, metavar="DURATION",
        help="time between polls of every endpoint (default 15s)")  # fmt: skip
    add("--collector.nccl-ras.persist-polls", dest="nccl_ras_persist_polls", type=int,
        default=Options.nccl_ras_persist_polls, metavar="N",
        help="successive polls a count mismatch must hold with its lowest count unchanged "
        f"before it is reported (default {nccl_ras.DEFAULT_PERSIST_POLLS})")  # fmt: skip
    add("--collector.nccl-ras.timeout", dest="nccl_ras_timeout", type=argtype(parse_duration),
        default=Options.nccl_ras_timeout, metavar="DURATION",
        help=f"deadline for one report after STATUS (default {nccl_ras.REPORT_TIMEOUT_S:g}s)")  # fmt: skip
    add("--collector.nccl-ras.max-bytes", dest="nccl_ras_max_bytes", type=int,
        default=Options.nccl_ras_max_bytes, metavar="BYTES",
        help=f"largest report read (default {nccl_ras.DEFAULT_MAX_BYTES})")  # fmt: skip


def build(config: DaemonConfig, sources: Sources) -> Collector:
    """One endpoint per distinct address, polled by a poller the daemon runs."""
    o = config.options_of(Options)
    if o.nccl_ras_persist_polls < 1:
        raise ValueError("--collector.nccl-ras.persist-polls must be 1 or more")
    endpoints = [
        Endpoint(
            address,
            persist_polls=o.nccl_ras_persist_polls,
            max_bytes=o.nccl_ras_max_bytes,
            report_timeout=o.nccl_ras_timeout,
        )
        for address in dict.fromkeys(o.nccl_ras_address or [nccl_ras.DEFAULT_ADDRESS])
    ]
    for poller in pollers(endpoints, o.nccl_ras_interval):
        sources.run(poller)
    return Collector(NAME, lambda: collect(endpoints, sources.flight))


def pid_identities(view: FlightView) -> dict[int, Identity | None]:
    """pid -> the one (boot, rank) of the flight records that has it, newest boot first;
    None for a pid held by several (boot, rank) of the boot it is found in."""
    out: dict[int, Identity | None] = {}
    for boot in reversed(view.boots):
        found: dict[int, set[Identity]] = {}
        for st in view.streams:
            if st.boot == boot:
                found.setdefault(st.process.pid, set()).add((boot, st.process.rank))
        for pid, ids in found.items():
            out.setdefault(pid, next(iter(ids)) if len(ids) == 1 else None)
    return out


def map_ranks(
    comms: list[Communicator], identities: dict[int, Identity | None]
) -> dict[tuple[str, int], Identity]:
    """(host, pid) of RAS ranks -> (boot, rank), only where unambiguous."""
    hosts_of_pid: dict[int, set[str]] = {}
    for comm in comms:
        peers: list[RasRank | MissingRank] = [*comm.ranks, *comm.missing]
        for r in peers:
            hosts_of_pid.setdefault(r.pid, set()).add(r.host)
    out: dict[tuple[str, int], Identity] = {}
    for pid, hosts in hosts_of_pid.items():
        ident = identities.get(pid)
        if ident is not None and len(hosts) == 1 and pid >= 0:
            out[(next(iter(hosts)), pid)] = ident
    return out


def collect(endpoints: list[Endpoint], state: FlightState) -> Iterator[Metric]:
    identities = pid_identities(state.view())
    fams = {
        m.name.removeprefix("rankscope_nccl_"): gauge(m.name)
        for m in CATALOG
        if m.collector == NAME and m.type == "gauge"
    }
    collectives = counter("rankscope_nccl_collectives_total")
    errors = counter("rankscope_nccl_ras_poll_errors_total")
    polls = counter("rankscope_nccl_ras_polls_total")
    nccl = info("rankscope_nccl_info")
    for ep in (e.view for e in endpoints):
        a = ep.address
        add(polls, (a,), ep.polls)
        for reason in ERROR_REASONS:
            add(errors, (a, reason), ep.errors[reason])
        if ep.last_success is not None:
            add(fams["ras_up"], (a,), 1.0 if ep.last_success else 0.0)
            for reason in ERROR_REASONS:
                add(fams["ras_last_error"], (a, reason), float(ep.last_error == reason))
        add(fams["ras_poll_duration_seconds"], (a,), ep.last_duration)
        report = ep.report
        if report is None:
            continue
        cuda = (report.cuda_runtime_version, report.cuda_driver_version)
        nccl.add_metric(label_values(a, report.nccl_version, *cuda, report.format), {})
        comms = [s.comm for s in ep.comms]
        mapped = map_ranks(comms, identities)
        add(fams["communicators"], (a,), len(comms))
        for comm in comms:
            # The comm's boot: the one boot its mapped ranks have, if one.
            boots = {mapped[r.host, r.pid][0] for r in comm.ranks if (r.host, r.pid) in mapped}
            key = (a, comm.hash, comm.secondary_hash, boots.pop() if len(boots) == 1 else None)
            add(fams["communicator_size"], key, comm.size)
            add(fams["communicator_ranks_reporting"], key, comm.ranks_count)
            add(fams["communicator_ranks_missing"], key, comm.missing_ranks_count)
            persisting = ep.persisting.get(comm.key, ())
            ops = {op for r in comm.ranks for op in r.counts}
            ops |= {op for op in comm.reported_mismatches if op != "status"}
            for op in sorted(ops):
                add(fams["count_mismatch"], (*key, op), float(op in persisting))
            if comm.ranks or "status" in comm.reported_mismatches:
                add(fams["status_mismatch"], key, float("status" in persisting))
            for r in comm.ranks:
                for op, n in sorted(r.counts.items()):
                    add(collectives, (*_rank_key(key, r, mapped), op), n)
            for m in comm.missing:
                how = "dead" if m.considered_dead else "unresponsive" if m.unresponsive else None
                if how is not None:
                    add(fams["rank_missing"], (*_rank_key(key, m, mapped), how), 1.0)
        dead = {(m.host, m.pid) for comm in comms for m in comm.missing if m.considered_dead}
        dead_count = report.dead_count if report.format == "text" else len(dead)
        add(fams["dead_processes"], (a,), dead_count)
    yield from (*fams.values(), collectives, errors, polls, nccl)


def _rank_key(
    key: tuple[object, ...], r: RasRank | MissingRank, mapped: dict[tuple[str, int], Identity]
) -> tuple[object, ...]:
    ident = mapped.get((r.host, r.pid))
    return (*key, r.rank, ident[1] if ident else None, r.host, r.pid)
