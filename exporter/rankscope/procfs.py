"""Every /proc read of rankscope, behind one injectable root (``proc``, default "/proc";
the daemon's --path.procfs, as node_exporter's), with the parse functions apart so they are
tested on fixture trees, and the one rank matcher (:class:`RankIndex`).

Used in the rank (its own identity: /proc/self) and in the daemon (every host pid's
identity and name, to tell ranks from foreign holders). A read that fails (the process
exited, or it is outside the reader's PID view) is None, never an exception.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

DEFAULT_ROOT = "/proc"


def read_start_ticks(pid: int | str = "self", proc: str = DEFAULT_ROOT) -> int | None:
    """Start time of a process in clock ticks since host boot (field 22 of /proc/PID/stat).

    The same number whichever PID namespace reads it, which is what lets a daemon with the
    host's view match a containerised rank's record to NVML's host pid.
    """
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return parse_stat_start_ticks(raw)


def parse_stat_start_ticks(stat_line: str) -> int | None:
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    close = stat_line.rfind(")")
    if close < 0:
        return None
    rest = stat_line[close + 2 :].split()
    # rest[0] is field 3 (state), so field 22 is rest[19].
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def read_nspid(pid: int | str = "self", proc: str = DEFAULT_ROOT) -> tuple[int, ...] | None:
    """The NSpid chain of /proc/PID/status: the pid in the reader's namespace first, the
    process's own (innermost) namespace last."""
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


# PROC_PID_INIT_INO: the inode of the host's (initial) PID namespace, fixed by the kernel. A
# process in it sees the pids NVML lists; a process in any other namespace does not.
HOST_PIDNS_INODE = 0xEFFFFFFC


def read_pidns_inode(pid: int | str = "self", proc: str = DEFAULT_ROOT) -> int | None:
    """Inode of the process's PID namespace (readlink /proc/PID/ns/pid -> 'pid:[N]')."""
    try:
        link = os.readlink(f"{proc}/{pid}/ns/pid")
    except OSError:
        return None
    try:
        return int(link[link.index("[") + 1 : link.index("]")])
    except ValueError:
        return None


def list_pids(proc: str = DEFAULT_ROOT) -> list[int]:
    """Every pid /proc lists; empty when it cannot be listed."""
    try:
        return [int(e) for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return []


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says about one host pid. Fields are None where /proc could not tell (the
    process exited, or it is outside the daemon's PID view)."""

    pid: int
    comm: str | None
    start_ticks: int | None
    nspid: tuple[int, ...] | None
    pidns: int | None


def parse_comm(raw: str) -> str:
    """/proc/PID/comm -> the process name (at most 15 bytes, a trailing newline)."""
    return raw.rstrip("\n")


def read_comm(pid: int, proc: str = DEFAULT_ROOT) -> str | None:
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return parse_comm(f.read())
    except OSError:
        return None


def read_proc_info(pid: int, proc: str = DEFAULT_ROOT) -> ProcInfo:
    return ProcInfo(
        pid=pid,
        comm=read_comm(pid, proc),
        start_ticks=read_start_ticks(pid, proc),
        nspid=read_nspid(pid, proc),
        pidns=read_pidns_inode(pid, proc),
    )


def parse_stat_comm(stat_line: str) -> str | None:
    """The comm field of /proc/PID/stat (what /proc/PID/comm holds, in parentheses; it may
    itself hold spaces and parentheses, so it ends at the last ')')."""
    start, end = stat_line.find("("), stat_line.rfind(")")
    return stat_line[start + 1 : end] if 0 <= start < end else None


def read_stat(pid: int, proc: str = DEFAULT_ROOT) -> tuple[int | None, str | None]:
    """(start ticks, comm) from one read of /proc/PID/stat; (None, None) when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None, None
    return parse_stat_start_ticks(raw), parse_stat_comm(raw)


class ProcCache:
    """ProcInfo per host pid. A pid seen before costs one read of /proc/P/stat per holdings
    read (start ticks and comm); the NSpid chain and the namespace are read again only when
    the start ticks change, i.e. the pid was recycled."""

    def __init__(self, proc: str = DEFAULT_ROOT) -> None:
        self.proc = proc
        self._infos: dict[int, ProcInfo] = {}

    def lookup(self, pids: Iterable[int]) -> dict[int, ProcInfo]:
        fresh: dict[int, ProcInfo] = {}
        for pid in pids:
            cached = self._infos.get(pid)
            start, comm = read_stat(pid, self.proc) if cached is not None else (None, None)
            if cached is not None and start is not None and cached.start_ticks == start:
                # A process may rename itself (prctl PR_SET_NAME).
                info = cached if comm == cached.comm else _with_comm(cached, comm)
            else:
                info = read_proc_info(pid, self.proc)
            fresh[pid] = info
        self._infos = fresh  # exited pids drop out here
        return fresh


def _with_comm(info: ProcInfo, comm: str | None) -> ProcInfo:
    return ProcInfo(info.pid, comm, info.start_ticks, info.nspid, info.pidns)


class RankIdentityLike(Protocol):
    """What a record says of the process that wrote it (rankscope.daemon.flightstate's
    RankProcess): its pid as it saw it, its start ticks, its PID namespace."""

    @property
    def pid(self) -> int: ...

    @property
    def start_ticks(self) -> int | None: ...

    @property
    def pidns(self) -> int | None: ...


R = TypeVar("R", bound=RankIdentityLike)


class RankIndex(Generic[R]):
    """The one rank matcher: the rank processes, indexed by (pid as the rank saw it, start
    ticks), matched against what /proc says of a host pid (docs/architecture.md, "The
    record"). The holdings ask it which rank a card's pid is; the flight state asks it which
    host pid a namespaced rank is."""

    def __init__(self, ranks: Iterable[R]) -> None:
        self._by_key: dict[tuple[int, int], list[R]] = {}
        for rp in ranks:
            if rp.start_ticks is None:
                continue  # without start ticks a pid alone could be a recycled one
            self._by_key.setdefault((rp.pid, rp.start_ticks), []).append(rp)

    def match(self, info: ProcInfo) -> R | None:
        """The rank process a host pid is, or None. The host name is not compared: a
        container has its own, and pid + start ticks + namespace already pin the process."""
        if not info.nspid or info.start_ticks is None:
            return None
        candidates = self._by_key.get((info.nspid[-1], info.start_ticks), [])
        matches = [
            rp
            for rp in candidates
            if rp.pidns is None or info.pidns is None or rp.pidns == info.pidns
        ]
        # Several records of one process (it moved to a newer boot): the first wins, and
        # the flight state lists the newest boot first.
        return matches[0] if matches else None
