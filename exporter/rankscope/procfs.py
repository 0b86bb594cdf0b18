"""Every /proc read of rankscope, behind one root (``proc``: the daemon's --path.procfs),
and the one rank matcher (:class:`RankIndex`). The rank reads its own identity
(/proc/self); the daemon every host pid's, to tell ranks from foreign holders. A read that
fails (the process exited, or is outside the reader's PID view) is None, never raises."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

DEFAULT_ROOT = "/proc"


def read_start_ticks(pid: int | str = "self", proc: str = DEFAULT_ROOT) -> int | None:
    """Start time in clock ticks since host boot (/proc/PID/stat field 22): alike from every
    PID namespace, so a daemon can match a containerised rank's record to NVML's host pid."""
    return read_stat(pid, proc)[0]


def read_nspid(pid: int | str = "self", proc: str = DEFAULT_ROOT) -> tuple[int, ...] | None:
    """/proc/PID/status's NSpid chain: the reader's namespace's pid first, the innermost last."""
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return None


# PROC_PID_INIT_INO: the inode of the host's (initial) PID namespace, fixed by the kernel. A
# process in it sees the pids NVML lists; a process in any other namespace does not.
HOST_PIDNS_INODE = 0xEFFFFFFC


def read_pidns_inode(pid: int | str = "self", proc: str = DEFAULT_ROOT) -> int | None:
    """Inode of the process's PID namespace (readlink /proc/PID/ns/pid -> 'pid:[N]')."""
    try:
        link = os.readlink(f"{proc}/{pid}/ns/pid")
        return int(link[link.index("[") + 1 : link.index("]")])
    except (OSError, ValueError):
        return None


# (host, pid, start ticks, pid namespace inode) -> running, gone, or None: cannot tell here
Alive = Callable[[str | None, int | None, int | None, int | None], "bool | None"]


def local_alive(
    host: str | None, pid: int | None, start_ticks: int | None, pidns: int | None
) -> bool | None:
    """From /proc, on the host that wrote the record and in its PID namespace; elsewhere None.
    A pid reused by another process (other start ticks) is gone."""
    if host != socket.gethostname() or pid is None or start_ticks is None or pidns is None:
        return None
    return read_start_ticks(pid) == start_ticks if pidns == read_pidns_inode("self") else None


def list_pids(proc: str = DEFAULT_ROOT) -> list[int]:
    """Every pid /proc lists; empty when it cannot be listed."""
    try:
        return [int(e) for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return []


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says of one host pid; None where it could not tell."""

    pid: int
    comm: str | None
    start_ticks: int | None
    nspid: tuple[int, ...] | None
    pidns: int | None


def read_proc_info(pid: int, proc: str = DEFAULT_ROOT) -> ProcInfo:
    start_ticks, comm = read_stat(pid, proc)
    return ProcInfo(pid, comm, start_ticks, read_nspid(pid, proc), read_pidns_inode(pid, proc))


def parse_stat_comm(stat_line: str) -> str | None:
    """/proc/PID/stat's comm, which may hold spaces and parentheses: up to the last ')'."""
    start, end = stat_line.find("("), stat_line.rfind(")")
    return stat_line[start + 1 : end] if 0 <= start < end else None


def read_stat(pid: int | str, proc: str = DEFAULT_ROOT) -> tuple[int | None, str | None]:
    """(start ticks, comm) from one read of /proc/PID/stat; (None, None) when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None, None
    # The fields after comm's last ')' start at field 3 (state): field 22 is the 20th.
    try:
        start_ticks = int(raw[raw.rindex(")") + 2 :].split()[19])
    except (IndexError, ValueError):
        start_ticks = None
    return start_ticks, parse_stat_comm(raw)


class ProcCache:
    """ProcInfo per host pid: a known pid costs one read of /proc/P/stat, its NSpid chain and
    namespace read again only when its start ticks change (recycled)."""

    def __init__(self, proc: str = DEFAULT_ROOT) -> None:
        self.proc = proc
        self._infos: dict[int, ProcInfo] = {}

    def lookup(self, pids: Iterable[int]) -> dict[int, ProcInfo]:
        fresh: dict[int, ProcInfo] = {}
        for pid in pids:
            cached = self._infos.get(pid)
            start, comm = read_stat(pid, self.proc) if cached is not None else (None, None)
            if cached is None or start is None or cached.start_ticks != start:
                fresh[pid] = read_proc_info(pid, self.proc)
            elif cached.comm != comm:  # the same process, renamed (prctl PR_SET_NAME)
                fresh[pid] = dataclasses.replace(cached, comm=comm)
            else:
                fresh[pid] = cached
        self._infos = fresh  # exited pids drop out here
        return fresh


class RankIdentityLike(Protocol):
    """What a record says of the process that wrote it (the daemon's RankProcess)."""

    @property
    def pid(self) -> int: ...

    @property
    def start_ticks(self) -> int | None: ...

    @property
    def pidns(self) -> int | None: ...


R = TypeVar("R", bound=RankIdentityLike)


class RankIndex(Generic[R]):
    """The rank processes by (pid as the rank saw it, start ticks), matched against what /proc
    says of a host pid: which rank a card's pid is, which host pid a namespaced rank is."""

    def __init__(self, ranks: Iterable[R]) -> None:
        self._by_key: dict[tuple[int, int], list[R]] = {}
        for rp in ranks:
            if rp.start_ticks is None:
                continue  # without start ticks a pid alone could be a recycled one
            self._by_key.setdefault((rp.pid, rp.start_ticks), []).append(rp)

    def match(self, info: ProcInfo) -> R | None:
        """The rank process a host pid is, or None. Not by host name (a container has its own):
        pid, start ticks and namespace pin the process."""
        if not info.nspid or info.start_ticks is None:
            return None
        candidates = self._by_key.get((info.nspid[-1], info.start_ticks), [])
        # Several records of one process (it moved to a newer boot): the first wins, and
        # the flight state lists the newest boot first.
        pidns = info.pidns
        return next((r for r in candidates if None in (r.pidns, pidns) or r.pidns == pidns), None)
