"""The ledger: where each process's VRAM went between its marks, and each card's identity.

Pure functions over flight records (rankscope.flight), shared by `rankscope phases`, the
daemon's /api/v1/phases and the status page:

- posts: the signed change between consecutive marks of one process and runner, per view
  (allocator reserved, allocator allocated, the card's used memory from the driver, this
  process's NVML bytes, the non-torch residue). Never across a boot seam or a change of
  card; a phase that target and draft both run is kept apart by runner.
- card identity at each mark: total = rank_resident + foreign + free + unattributed, where
  rank_resident is the NVML bytes of the boot's processes on the card, foreign the bytes of
  every other pid in the mark's pid map, and unattributed the signed remainder; its drift
  (the change of unattributed since the card's first mark in the boot) is reported.

Bytes are integers; an unmeasured quantity is None, never 0.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

from rankscope.flight import SKIP_REASONS, Flight, Record, process_key
from rankscope.record import HOST_PIDNS_INODE

MiB = 1 << 20

# view name -> how to read it from a mark
VIEWS: dict[str, Callable[[Record], int | None]] = {
    "allocator": lambda m: _get(m, "torch", "reserved"),
    "allocated": lambda m: _get(m, "torch", "allocated"),
    "driver": lambda m: _used(m),
    "process": lambda m: _get(m, "nvml", "self_bytes"),
    "non_torch": lambda m: _get(m, "derived", "non_torch"),
}

HostPid = Callable[[Record], "int | None"]


def _get(rec: Record, section: str, name: str) -> int | None:
    part = rec.get(section)
    if not isinstance(part, dict):
        return None
    value = part.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _used(rec: Record) -> int | None:
    free, total = _get(rec, "driver", "free"), _get(rec, "driver", "total")
    return total - free if free is not None and total is not None else None


def _delta(before: int | None, after: int | None) -> int | None:
    return after - before if before is not None and after is not None else None


def card_of(mark: Record) -> str | None:
    device = mark.get("device")
    uuid = device.get("uuid") if isinstance(device, dict) else None
    return uuid if isinstance(uuid, str) else None


def gpu_of(mark: Record) -> int | None:
    """NVML's index of the mark's card (the `gpu` label, as NVIDIA's exporters number it)."""
    return _get(mark, "device", "nvml_index")


def marks_of(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.get("kind") == "mark" and isinstance(r.get("phase"), str)]


def host_pid(rec: Record) -> int | None:
    """The pid NVML lists for the process that wrote ``rec``, where the record alone tells:
    a process in the host PID namespace. (The daemon, with the host's /proc, resolves the
    others and passes its own resolver.)"""
    return rec["pid"] if rec.get("pidns") == HOST_PIDNS_INODE else None


# --- posts ----------------------------------------------------------------------------------


def posts(records: Iterable[Record]) -> list[dict[str, Any]]:
    """Posts between consecutive marks of the same (boot, process, runner), in mark order."""
    last: dict[tuple[Any, ...], Record] = {}
    out: list[dict[str, Any]] = []
    for mark in marks_of(records):
        key = (mark["boot"], *process_key(mark), mark.get("runner"))
        before = last.get(key)
        last[key] = mark
        if before is None:
            continue
        card = card_of(mark)
        if card_of(before) is not None and card is not None and card_of(before) != card:
            continue  # the process moved to another card: a seam, not a post
        out.append(
            {
                "boot": mark["boot"],
                "host": mark["host"],
                "pid": mark["pid"],
                "start_ticks": mark.get("start_ticks"),
                "rank": mark.get("rank"),
                "tp_rank": mark.get("tp_rank"),
                "pp_rank": mark.get("pp_rank"),
                "runner": mark.get("runner"),
                "post": f"{before['phase']}->{mark['phase']}",
                "since": before["phase"],
                "phase": mark["phase"],
                "wall": mark["wall"],
                "seconds": float(mark["wall"]) - float(before["wall"]),
                "uuid": card,
                "gpu": gpu_of(mark),
                "views": {name: _delta(read(before), read(mark)) for name, read in VIEWS.items()},
            }
        )
    return out


# --- per-card identity ----------------------------------------------------------------------


def card_identities(
    records: Iterable[Record], resolve_host_pid: HostPid = host_pid
) -> list[dict[str, Any]]:
    """One identity per card, per mark that measured the card, in time order.

    The boot's processes are every process with a record among ``records`` (marks or census),
    identified on the card by ``resolve_host_pid``. A pid map entry of unknown size makes the
    sum it belongs to unknown.
    """
    records = list(records)
    boot_pids: set[int] = set()
    unresolved = 0
    for rec in {process_key(r): r for r in records}.values():
        pid = resolve_host_pid(rec)
        if pid is None:
            unresolved += 1
        else:
            boot_pids.add(pid)
    by_card: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    baseline: dict[str, int] = {}  # each card's first measured unattributed bytes
    for mark in sorted(marks_of(records), key=lambda m: float(m["wall"])):
        card = card_of(mark)
        free, total = _get(mark, "driver", "free"), _get(mark, "driver", "total")
        procs = (mark.get("nvml") or {}).get("procs")
        if card is None or free is None or total is None or not isinstance(procs, dict):
            continue
        rank_resident: int | None = 0
        foreign: int | None = 0
        foreign_pids: dict[str, int | None] = {}
        for pid_text, used in procs.items():
            pid = int(pid_text)
            size = used if isinstance(used, int) and not isinstance(used, bool) else None
            if pid in boot_pids:
                rank_resident = (
                    None if rank_resident is None or size is None else rank_resident + size
                )
            else:
                foreign_pids[pid_text] = size
                foreign = None if foreign is None or size is None else foreign + size
        unattributed = (
            total - rank_resident - foreign - free
            if rank_resident is not None and foreign is not None
            else None
        )
        if unattributed is not None:
            baseline.setdefault(card, unattributed)
        by_card[card].append(
            {
                "phase": mark["phase"],
                "runner": mark.get("runner"),
                "pid": mark["pid"],
                "rank": mark.get("rank"),
                "wall": mark["wall"],
                "gpu": gpu_of(mark),
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


# --- the phases document (rankscope phases --json, GET /api/v1/phases) -----------------------


_IDENTITY_FIELDS = ("rank", "local_rank", "world_size", "tp_rank", "pp_rank", "nspid", "pidns")


def _mark_row(mark: Record) -> dict[str, Any]:
    return {
        "phase": mark["phase"],
        "runner": mark.get("runner"),
        "wall": mark["wall"],
        "uuid": card_of(mark),
        "gpu": gpu_of(mark),
        "reserved": _get(mark, "torch", "reserved"),
        "allocated": _get(mark, "torch", "allocated"),
        "peak_allocated": _get(mark, "torch", "peak_allocated"),
        "num_alloc_retries": _get(mark, "torch", "num_alloc_retries"),
        "num_ooms": _get(mark, "torch", "num_ooms"),
        "free": _get(mark, "driver", "free"),
        "total": _get(mark, "driver", "total"),
        "process_bytes": _get(mark, "nvml", "self_bytes"),
        "non_torch": _get(mark, "derived", "non_torch"),
        "non_torch_measured": bool((mark.get("derived") or {}).get("non_torch_measured")),
        "unbacked_reservation": _get(mark, "derived", "unbacked_reservation"),
        "arenas": mark.get("arenas") or {},
        "why": _whys(mark),
        "extra": mark.get("extra") or {},
    }


def _whys(mark: Record) -> dict[str, str]:
    out = {}
    for section in ("device", "torch", "driver", "nvml"):
        part = mark.get(section)
        if isinstance(part, dict) and isinstance(part.get("why"), str):
            out[section] = part["why"]
    return out


def phases_document(flight: Flight, resolve_host_pid: HostPid = host_pid) -> dict[str, Any]:
    """What `rankscope phases --json` prints and /api/v1/phases returns (docs/probe.md)."""
    marks = marks_of(flight.records)
    all_posts = posts(marks)
    posts_by_process: dict[tuple[str, int, int | None], list[dict[str, Any]]] = (
        collections.defaultdict(list)
    )
    for post in all_posts:
        posts_by_process[(post["host"], post["pid"], post["start_ticks"])].append(post)
    processes: dict[tuple[str, int, int | None], dict[str, Any]] = {}
    for mark in marks:
        key = process_key(mark)
        entry = processes.get(key)
        if entry is None:
            entry = processes[key] = {
                "boot": mark["boot"],
                "host": mark["host"],
                "pid": mark["pid"],
                "start_ticks": mark.get("start_ticks"),
                **{name: mark.get(name) for name in _IDENTITY_FIELDS},
                "marks": [],
                "posts": posts_by_process.get(key, []),
            }
        entry["marks"].append(_mark_row(mark))
    ordered = sorted(
        processes.values(),
        key=lambda p: (p["rank"] is None, p["rank"] or 0, p["host"], p["pid"]),
    )
    return {
        "boot": flight.boot,
        "skipped": {reason: flight.skipped.get(reason, 0) for reason in SKIP_REASONS},
        "processes": ordered,
        "cards": card_identities(flight.records, resolve_host_pid),
    }
