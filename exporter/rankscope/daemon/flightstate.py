"""What the daemon knows from the flight directory, kept current by tailing it.

The daemon never re-reads what it has read: a :class:`rankscope.flight.FlightReader` hands
over the lines appended since the last refresh, and only what the collectors need is kept,
per file and boot: every mark (they are few, and the ledger needs them in order to compute
posts), the latest census line, the latest snapshot, the latest arena figures, and the
latest divergence per (group, op). A file that disappears takes its state with it, so the
series of a boot whose files were removed disappear too.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rankscope.flight import FILE_SUFFIX, SKIP_REASONS, FlightReader, Record
from rankscope.ledger import host_pid
from rankscope.record import read_nspid, read_pidns_inode, read_start_ticks
from rankscope.schema import Census, CensusDump, Divergence, Line, Mark

# A process that marks in a loop must not grow the daemon without bound; past this many
# marks per process and boot the daemon forgets the oldest (the file keeps them).
MAX_MARKS_PER_PROCESS = 4096

log = logging.getLogger("rankscope.daemon")


@dataclass(frozen=True)
class RankProcess:
    """One process that wrote records, as its records identify it (docs/architecture.md,
    "The record"): ``pid`` is the pid as the rank saw it, ``nspid`` its NSpid chain as it
    saw it, ``pidns`` the inode of its PID namespace."""

    host: str
    pid: int
    start_ticks: int | None
    nspid: tuple[int, ...] | None
    pidns: int | None
    boot: str
    rank: int | None
    local_rank: int | None


def rank_process(rec: Record) -> RankProcess:
    """The identity fields of a record's header."""
    h = rec.header
    return RankProcess(
        host=h.host,
        pid=h.pid,
        start_ticks=h.start_ticks,
        nspid=h.nspid,
        pidns=h.pidns,
        boot=h.boot,
        rank=h.rank,
        local_rank=h.local_rank,
    )


@dataclass
class StreamState:
    """What one file holds about one boot (a file is one process and stream; a process
    that changed its boot id mid-run has a state per boot)."""

    file: str
    boot: str
    process: RankProcess
    first_wall: float  # orders the boots: the newest boot is the one that began last
    marks: list[Line[Mark]] = field(default_factory=list)
    census: Line[Census | CensusDump] | None = None  # latest census or census_dump line
    snapshot: Line[Census] | None = None  # latest census line (a snapshot round)
    arenas: Line[Mark] | None = None  # latest line carrying arena figures (a mark)
    marks_forgotten: int = 0  # oldest marks dropped past MAX_MARKS_PER_PROCESS


@dataclass(frozen=True)
class FlightView:
    """A consistent copy of the state for one scrape or one API answer."""

    streams: tuple[StreamState, ...]
    divergences: dict[str, dict[tuple[str, str], Line[Divergence]]]  # boot -> (group, op)
    boots: tuple[str, ...]  # oldest first, by first record
    skipped: dict[str, int]
    invalid: dict[str, int]  # field name -> values nulled by the parse (rankscope.schema)

    @property
    def latest_boot(self) -> str | None:
        return self.boots[-1] if self.boots else None

    def recent_boots(self, count: int) -> set[str]:
        """The ``count`` newest boots; every boot when count is 0."""
        return set(self.boots if count <= 0 else self.boots[-count:])


class FlightState:
    """The tailed flight directory. ``refresh()`` reads what was appended; the collectors,
    the API and the holdings read a :class:`FlightView` of it."""

    def __init__(self, flight_dir: str | os.PathLike[str]) -> None:
        self.flight_dir = Path(flight_dir)
        self._reader = FlightReader(self.flight_dir)
        self._lock = threading.Lock()
        self._streams: dict[tuple[str, str], StreamState] = {}
        self._divergences: dict[str, dict[tuple[str, str], Line[Divergence]]] = {}
        self.up: bool | None = None  # None until the first refresh
        self.error: str | None = None

    def refresh(self) -> bool:
        """Read what was appended since the last refresh; False (and ``error`` set) when the
        directory cannot be read. Never raises: an unreadable directory is a down source."""
        with self._lock:
            try:
                records = self._reader.poll()
                present = _present_files(self.flight_dir)
            except OSError as exc:
                self.up, self.error = False, str(exc)
                return False
            for rec in records:
                self._add(rec)
            self._forget_missing(present)
            self.up, self.error = True, None
            return True

    def view(self) -> FlightView:
        with self._lock:
            firsts: dict[str, float] = {}
            for st in self._streams.values():
                firsts[st.boot] = min(firsts.get(st.boot, st.first_wall), st.first_wall)
            boots = tuple(sorted(firsts, key=lambda b: (firsts[b], b)))
            return FlightView(
                # Copies of the mark lists: a refresh on another thread may append.
                streams=tuple(replace(st, marks=list(st.marks)) for st in self._streams.values()),
                divergences={boot: dict(by_key) for boot, by_key in self._divergences.items()},
                boots=boots,
                skipped={reason: self._reader.skipped[reason] for reason in SKIP_REASONS},
                invalid=dict(self._reader.invalid),
            )

    def latest_boot(self) -> str | None:
        """The newest boot now (refreshed first)."""
        self.refresh()
        return self.view().latest_boot

    def rank_processes(self) -> list[RankProcess]:
        """Every process the flight directory records, newest boot's first (what the
        holdings match NVML's host pids against; a process that exited simply never
        matches, since its start time identifies it)."""
        self.refresh()
        view = self.view()
        order = {boot: i for i, boot in enumerate(reversed(view.boots))}
        seen: dict[tuple[str, int, int | None, str], RankProcess] = {}
        for st in sorted(view.streams, key=lambda s: order.get(s.boot, len(order))):
            p = st.process
            seen.setdefault((p.host, p.pid, p.start_ticks, p.boot), p)
        return list(seen.values())

    # --- folding records in ---------------------------------------------------------------

    def _add(self, rec: Record) -> None:
        h = rec.header
        key = (h.file, h.boot)
        st = self._streams.get(key)
        if st is None:
            st = self._streams[key] = StreamState(
                file=h.file,
                boot=h.boot,
                process=rank_process(rec),
                first_wall=h.wall,
            )
        else:
            st.first_wall = min(st.first_wall, h.wall)
            st.process = rank_process(rec)  # rank fields may be configured late
        body = rec.body
        if isinstance(body, Mark):
            line = Line(h, body)
            st.marks.append(line)
            st.arenas = line
            if len(st.marks) > MAX_MARKS_PER_PROCESS:
                st.marks_forgotten += 1
                if st.marks_forgotten == 1:
                    log.warning(
                        "%s holds more than %d marks of boot %s: the daemon keeps the newest "
                        "(the file keeps them all)",
                        h.file,
                        MAX_MARKS_PER_PROCESS,
                        h.boot,
                    )
                del st.marks[0]
        elif isinstance(body, Census):
            st.census = st.snapshot = Line(h, body)
        elif isinstance(body, CensusDump):
            st.census = Line(h, body)
        elif isinstance(body, Divergence):
            # The newest comparison round wins, as in the census report.
            by_key = self._divergences.setdefault(h.boot, {})
            held = by_key.get((body.group, body.op))
            if held is None or _round_wall(held) <= _round_wall(Line(h, body)):
                by_key[(body.group, body.op)] = Line(h, body)

    def _forget_missing(self, present: set[str]) -> None:
        for key in [k for k in self._streams if k[0] not in present]:
            del self._streams[key]
        for boot, by_key in list(self._divergences.items()):
            for gk in [gk for gk, line in by_key.items() if line.header.file not in present]:
                del by_key[gk]
            if not by_key:
                del self._divergences[boot]


def _present_files(flight_dir: Path) -> set[str]:
    try:
        return {e.name for e in os.scandir(flight_dir) if e.name.endswith(FILE_SUFFIX)}
    except FileNotFoundError:
        return set()  # no job has written yet: nothing recorded, not an error


def _round_wall(line: Line[Divergence]) -> tuple[int, float]:
    round_ = line.body.round
    return (round_ if round_ is not None else -1, line.header.wall)


def host_pid_resolver(proc: str = "/proc") -> Callable[[Record], int | None]:
    """For the ledger's card identities: the host pid of the process that wrote a record.

    A record from the host's PID namespace names it; otherwise this daemon's /proc (the
    host's view) is searched for the process whose NSpid chain ends in the record's pid,
    with the record's start time and namespace, so a rank in a container counts as a rank
    and not as a foreign holder. /proc is scanned once, on first use, per resolver.
    """
    index: dict[tuple[int, int], list[tuple[int, int | None]]] | None = None

    def resolve(rec: Record) -> int | None:
        nonlocal index
        known = host_pid(rec)
        if known is not None:
            return known
        start, pidns = rec.header.start_ticks, rec.header.pidns
        if start is None:
            return None
        if index is None:
            index = _scan_proc(proc)
        for pid, ns in index.get((rec.header.pid, start), []):
            if pidns is None or ns is None or ns == pidns:
                return pid
        return None

    return resolve


def _scan_proc(proc: str) -> dict[tuple[int, int], list[tuple[int, int | None]]]:
    """(pid in its own namespace, start ticks) -> [(host pid, namespace inode)]."""
    index: dict[tuple[int, int], list[tuple[int, int | None]]] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return index
    for entry in entries:
        nspid = read_nspid(entry, proc)
        start = read_start_ticks(entry, proc)
        if nspid and start is not None:
            index.setdefault((nspid[-1], start), []).append(
                (int(entry), read_pidns_inode(entry, proc))
            )
    return index
