"""The ledger, for `rankscope phases`, /api/v1/phases and the status page: posts (the signed
change per view between consecutive marks of one boot, process and runner, never across cards)
and each card's identity at each mark: total = rank_resident + foreign + free + unattributed
(the signed remainder, with its drift since the card's first mark). Unmeasured is None."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

from rankscope.record import Line, Mark, of_kind
from rankscope.record.reader import SKIP_REASONS, Flight, HostPid, Record, host_pid

MiB = 1 << 20

MarkLine = Line[Mark]

VIEWS: dict[str, Callable[[Mark], int | None]] = {
    "allocator": lambda m: m.torch.reserved,
    "allocated": lambda m: m.torch.allocated,
    "driver": lambda m: m.driver.used,
    "process": lambda m: m.nvml.self_bytes,
    "non_torch": lambda m: m.derived.non_torch,
}


def _delta(before: int | None, after: int | None) -> int | None:
    return after - before if before is not None and after is not None else None


def _sum(sizes: Iterable[int | None]) -> int | None:
    """The sum, unknown when any part is."""
    parts = list(sizes)
    return None if None in parts else sum(p for p in parts if p is not None)


def fields(obj: Any, names: Iterable[str]) -> dict[str, Any]:
    """``obj``'s attributes ``names``, as a JSON object in that order."""
    return {name: getattr(obj, name) for name in names}


def posts(records: Iterable[Record]) -> list[dict[str, Any]]:
    """Posts between consecutive marks of one (boot, process, runner), in mark order."""
    last: dict[tuple[Any, ...], MarkLine] = {}
    out: list[dict[str, Any]] = []
    for line in of_kind(records, Mark):
        h, mark = line.header, line.body
        key = (h.boot, *h.process_key, h.runner)
        previous = last.get(key)
        last[key] = line
        if previous is None:
            continue
        before = previous.body
        card = mark.device.uuid
        if before.device.uuid is not None and card is not None and before.device.uuid != card:
            continue  # the process moved to another card: a seam, not a post
        out.append(
            {
                **fields(h, ("boot", "host", "pid", "start_ticks", "rank", "tp_rank", "pp_rank")),
                "runner": h.runner,
                "post": f"{before.phase}->{mark.phase}",
                "since": before.phase,
                "phase": mark.phase,
                "wall": h.wall,
                "seconds": h.wall - previous.header.wall,
                "uuid": card,
                "gpu": mark.device.nvml_index,
                "views": {name: _delta(read(before), read(mark)) for name, read in VIEWS.items()},
            }
        )
    return out


def card_identities(
    records: Iterable[Record], resolve_host_pid: HostPid = host_pid
) -> list[dict[str, Any]]:
    """Per card, one identity per mark that measured it, in time order."""
    records = list(records)
    pids = [resolve_host_pid(r) for r in {r.header.process_key: r for r in records}.values()]
    boot_pids = {pid for pid in pids if pid is not None}
    unresolved = pids.count(None)
    by_card: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    baseline: dict[str, int] = {}  # each card's first measured unattributed bytes
    for line in sorted(of_kind(records, Mark), key=lambda m: m.header.wall):
        h, mark = line.header, line.body
        card = mark.device.uuid
        free, total, procs = mark.driver.free, mark.driver.total, mark.nvml.procs
        if card is None or free is None or total is None or procs is None:
            continue
        foreign_pids = {str(pid): size for pid, size in procs.items() if pid not in boot_pids}
        rank_resident = _sum(size for pid, size in procs.items() if pid in boot_pids)
        foreign = _sum(foreign_pids.values())
        unattributed = None
        if rank_resident is not None and foreign is not None:
            unattributed = total - rank_resident - foreign - free
            baseline.setdefault(card, unattributed)
        by_card[card].append(
            {
                "phase": mark.phase,
                **fields(h, ("runner", "pid", "rank", "wall")),
                "gpu": mark.device.nvml_index,
                "total": total,
                "free": free,
                "rank_resident": rank_resident,
                "foreign": foreign,
                "unattributed": unattributed,
                "drift": _delta(baseline.get(card), unattributed),
                "foreign_pids": foreign_pids,
                "unresolved_processes": unresolved,
            }
        )
    cards = [
        {"uuid": card, "gpu": rows[-1]["gpu"], "identities": rows} for card, rows in by_card.items()
    ]
    return sorted(cards, key=lambda c: (c["gpu"] is None, c["gpu"] or 0, c["uuid"]))


def _mark_row(line: MarkLine) -> dict[str, Any]:
    h, mark = line.header, line.body
    return {
        "phase": mark.phase,
        "runner": h.runner,
        "wall": h.wall,
        "uuid": mark.device.uuid,
        "gpu": mark.device.nvml_index,
        **fields(mark.torch, ("reserved", "allocated", "peak_allocated")),
        **fields(mark.torch, ("num_alloc_retries", "num_ooms")),
        **fields(mark.driver, ("free", "total")),
        "process_bytes": mark.nvml.self_bytes,
        **fields(mark.derived, ("non_torch", "non_torch_measured", "unbacked_reservation")),
        "arenas": {name: arena.to_json() for name, arena in mark.arenas.items()},
        "why": {
            name: section.why
            for name, section in fields(mark, ("device", "torch", "driver", "nvml")).items()
            if section.why is not None
        },
        "extra": mark.extra,
    }


def _process(lines: list[MarkLine]) -> dict[str, Any]:
    """One process's marks and posts, under what its records say of it: the identity of its
    first ranked mark, since a spawned rank learns its rank only at init."""
    h = next((line.header for line in lines if line.header.rank is not None), lines[0].header)
    return {
        **fields(h, ("boot", "host", "pid", "start_ticks", "rank", "local_rank")),
        **fields(h, ("world_size", "tp_rank", "pp_rank")),
        "nspid": list(h.nspid) if h.nspid is not None else None,
        "pidns": h.pidns,
        "marks": [_mark_row(line) for line in lines],
        "posts": posts(lines),
    }


def phases_document(flight: Flight, resolve_host_pid: HostPid = host_pid) -> dict[str, Any]:
    """What `rankscope phases --json` prints and /api/v1/phases returns (docs/probe.md)."""
    by_process: dict[tuple[str, int, int | None], list[MarkLine]] = {}
    for line in of_kind(flight.records, Mark):
        by_process.setdefault(line.header.process_key, []).append(line)
    processes = sorted(
        map(_process, by_process.values()),
        key=lambda p: (p["rank"] is None, p["rank"] or 0, p["host"], p["pid"]),
    )
    return {
        "boot": flight.boot,
        "skipped": {reason: flight.skipped.get(reason, 0) for reason in SKIP_REASONS},
        "processes": processes,
        "cards": card_identities(flight.records, resolve_host_pid),
    }
