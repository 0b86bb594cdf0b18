"""The flight source: what the daemon knows from the flight directory, kept current by
tailing it, per file and boot (bounded). A file that disappears takes its state with it."""

from __future__ import annotations

import collections
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from rankscope.daemon.dirwatch import DirWatch
from rankscope.procfs import (
    DEFAULT_ROOT,
    HOST_PIDNS_INODE,
    RankIndex,
    list_pids,
    read_proc_info,
    read_start_ticks,
)
from rankscope.record import Body, Census, CensusDump, CensusLive, Divergence, Line, Mark, Oom
from rankscope.record.reader import (
    SKIP_REASONS,
    BootNotFoundError,
    BootSummary,
    Flight,
    FlightReader,
    Record,
)

# Per process and boot, the newest lines kept (the file keeps them all).
MAX_MARKS_PER_PROCESS = 4096
MAX_CENSUS_LINES_PER_PROCESS = 4096
MAX_OOMS_PER_PROCESS = 64
EXITED_GRACE_S = 300.0  # an exited process's series stay this long: a last scrape sees them
READ_BUDGET_BYTES = 4 << 20
B = TypeVar("B", bound=Body)

log = logging.getLogger("rankscope.daemon")


@dataclass(frozen=True)
class RankProcess:
    """One process that wrote records: ``pid`` as the rank saw it, ``pidns`` its namespace."""

    host: str
    pid: int
    start_ticks: int | None
    pidns: int | None
    boot: str
    rank: int | None

    @property
    def key(self) -> tuple[str, int, int | None]:
        return (self.host, self.pid, self.start_ticks)


def rank_process(rec: Record) -> RankProcess:
    h = rec.header
    return RankProcess(h.host, h.pid, h.start_ticks, h.pidns, h.boot, h.rank)


@dataclass
class StreamState:
    """What one file (one process) holds about one boot."""

    file: str
    boot: str
    process: RankProcess
    first_wall: float  # orders the boots: the newest boot is the one that began last
    last_wall: float
    marks: list[Line[Mark]] = field(default_factory=list)
    census_lines: list[Record] = field(default_factory=list)  # census, dumps, divergences
    census: Line[Census | CensusDump] | None = None  # latest census or census_dump line
    snapshot: Line[Census] | None = None  # latest readable census line (a snapshot round)
    # The census_live lines folded into one: every count at its highest, the newest line's
    # header and stall (a live line carries only what changed, so none may be forgotten).
    live: Line[CensusLive] | None = None
    arenas: Line[Mark] | None = None  # latest line carrying arena figures (a mark)
    marks_forgotten: int = 0  # oldest marks dropped past MAX_MARKS_PER_PROCESS
    ooms: list[Line[Oom]] = field(default_factory=list)  # oom lines, newest last
    oom_counts: dict[tuple[int | None, str | None], int] = field(default_factory=dict)  # by card


@dataclass(frozen=True)
class FlightHealth:
    """The flight directory's part of readiness."""

    files: int  # flight files tracked
    unreadable: int  # of them, how many the last try could not read
    directory_error: str | None  # the directory is missing or cannot be listed
    backlog: int  # bytes left to read (catching up)

    def as_json(self) -> dict[str, object]:
        return {"files": self.files, "unreadable": self.unreadable}


@dataclass(frozen=True)
class FlightView:
    """A consistent copy of the state for one scrape or one API answer."""

    streams: tuple[StreamState, ...]
    divergences: dict[str, dict[tuple[str, str], Line[Divergence]]]  # boot -> (group, op)
    boots: tuple[str, ...]  # oldest first, by first record
    skipped: dict[str, int]
    invalid: dict[str, int]  # field name -> values nulled by the parse (rankscope.record.codec)

    @property
    def latest_boot(self) -> str | None:
        return self.boots[-1] if self.boots else None

    def recent_boots(self, count: int) -> set[str]:
        """The ``count`` newest boots; every boot when count is 0."""
        return set(self.boots if count <= 0 else self.boots[-count:])

    def rank_processes(self) -> list[RankProcess]:
        """Every process of the view, newest boot's first, each (host, pid, start, boot) once."""
        order = {boot: i for i, boot in enumerate(reversed(self.boots))}
        seen: dict[tuple[object, ...], RankProcess] = {}
        for st in sorted(self.streams, key=lambda s: order.get(s.boot, len(order))):
            seen.setdefault((*st.process.key, st.process.boot), st.process)
        return list(seen.values())


class FlightState:
    """``refresh()`` reads what was appended; readers take a :class:`FlightView` of it."""

    def __init__(
        self,
        flight_dir: str | os.PathLike[str],
        exited_grace: float = EXITED_GRACE_S,
        proc: str = DEFAULT_ROOT,
        read_budget: int = READ_BUDGET_BYTES,
        use_inotify: bool = True,
    ) -> None:
        self.flight_dir = Path(flight_dir)
        self.read_budget = read_budget
        self._catch_up_since: float | None = None
        self._backlog = 0  # the last finished poll's (the reader's moves while it reads)
        self.exited_grace = exited_grace
        self._proc = proc
        self._host = socket.gethostname()
        self._exited_at: dict[RankProcess, float] = {}  # time.monotonic() it was taken as gone
        self._reader = FlightReader(self.flight_dir)
        self._lock = threading.Lock()
        self._polling = threading.Lock()  # one refresh reads at a time
        self._dir_seen = self._dir_lost = False
        self._streams: dict[tuple[str, str], StreamState] = {}
        self._divergences: dict[str, dict[tuple[str, str], Line[Divergence]]] = {}
        self.up: bool | None = None  # None until the first refresh
        self.error: str | None = None
        self.refreshed_at: float | None = None  # time.monotonic() of the last refresh
        self._host_pids: dict[tuple[str, int, int | None], int | None] = {}
        self._watch = DirWatch(self.flight_dir, use_inotify)
        # Derived from every stream, made again only when the reader saw a change (None).
        self._reader_version = -1
        # This host's processes not found gone yet, each to its last record while it may have
        # exited before the daemon started (None once it came later or was found running).
        self._living: dict[RankProcess, float | None] = {}
        self._caught_up = False  # the directory as it was at start has been read
        self._boots: list[BootSummary] | None = None
        self._boot_streams: dict[str, dict[tuple[str, str], StreamState]] = {}
        self._boot_summaries: dict[str, BootSummary] = {}  # each with latest=False
        self._touched_boots: set[str] = set()  # whose summary is out of date
        self._view: tuple[FlightView, float] | None = None  # and until when it holds
        self._running: dict[tuple[str, int, int | None], bool] | None = None  # alive()'s

    def refresh(self) -> bool:
        """Reads what changed; False (and ``error`` set) when the directory cannot be listed.
        One file that cannot be read fails alone (``health().unreadable``)."""
        with self._polling:
            try:
                records = self._reader.poll(self.read_budget, self._watch.changes())
            except OSError as exc:
                with self._lock:
                    self.up, self.error = False, str(exc)
                return False
            reader = self._reader
            self._note_directory()
            self._note_backlog(reader.backlog)
            with self._lock:
                # A file truncated or replaced is read again: its old state goes first.
                if reader.removed or reader.restarted:
                    self._forget_missing(reader.present - reader.restarted)
                for rec in records:
                    self._add(rec)
                if reader.version != self._reader_version:
                    self._reader_version = reader.version
                    self._boots = self._view = self._running = None
                new = {
                    p.key: p
                    for rec in records
                    if (p := rank_process(rec)).pidns != HOST_PIDNS_INODE
                    and p.key not in self._host_pids
                }
                if new:
                    self._host_pids.update(host_pids(list(new.values()), self._proc))
                self._backlog = reader.backlog
                self._caught_up = self._caught_up or not reader.backlog
                self.up, self.error = True, None
                self.refreshed_at = time.monotonic()
            self._note_exits()
            return True

    def health(self) -> FlightHealth:
        with self._lock:
            missing = None if self._dir_seen else "no such directory"
            error = self.error if self.up is False else missing
            reader = self._reader
            return FlightHealth(len(reader.present), len(reader.unreadable), error, self._backlog)

    def _note_backlog(self, backlog: int) -> None:
        """Logs a backlog (a large directory at start-up) when it appears and when read."""
        now = time.monotonic()
        if backlog and self._catch_up_since is None:
            self._catch_up_since = now
            log.info(
                "catching up on flight directory %s: %.1f MiB left to read, %.0f MiB a refresh",
                self.flight_dir,
                backlog / 2**20,
                self.read_budget / 2**20,
            )
        elif not backlog and self._catch_up_since is not None:
            log.info("caught up on %s in %.1fs", self.flight_dir, now - self._catch_up_since)
            self._catch_up_since = None

    def _note_exits(self) -> None:
        """When each process of this host's PID namespace was found gone (under ``_polling``).
        One found gone stays gone, so only the living are looked at again; one already gone in
        the directory at start is gone since its last record (old restarts publish nothing)."""
        now, wall_now = time.monotonic(), time.time()
        exited: dict[RankProcess, float] = {}
        for p, last_wall in list(self._living.items()):
            pid = self.process_host_pid(p)
            if pid is None:  # another PID namespace's, not found in /proc: never judged
                del self._living[p]
            elif read_start_ticks(pid, self._proc) == p.start_ticks:
                self._living[p] = None  # running now: when it goes, it went then
            else:
                del self._living[p]
                exited[p] = now if last_wall is None else min(now, now - (wall_now - last_wall))
        if exited:
            with self._lock:
                self._exited_at.update(exited)
                self._view = self._running = None

    def _note_directory(self) -> None:
        """Logs the flight directory missing at start, going away and coming back."""
        exists = self.flight_dir.is_dir()
        if self.refreshed_at is None and not exists:
            log.warning(
                "flight directory %s does not exist; /readyz answers 503 until it does",
                self.flight_dir,
            )
        if self._dir_seen and not exists:
            self._dir_lost = True
            log.warning(
                "flight directory %s is gone; its series are dropped until it is back",
                self.flight_dir,
            )
        elif self._dir_lost and exists:
            self._dir_lost = False
            log.warning("flight directory %s is back", self.flight_dir)
        self._dir_seen = exists

    def refresh_if_older(self, max_age: float) -> None:
        """A burst of API requests costs one directory listing."""
        at = self.refreshed_at
        if at is None or time.monotonic() - at >= max_age:
            self.refresh()

    def _summaries(self) -> list[BootSummary]:
        """Every boot, oldest first; only the boots whose streams changed are summed again."""
        if self._boots is None:
            for boot in self._touched_boots:
                sts = list(self._boot_streams.get(boot, {}).values())
                if not sts:
                    self._boot_summaries.pop(boot, None)
                    continue
                self._boot_summaries[boot] = BootSummary(
                    boot=boot,
                    first_wall=min(st.first_wall for st in sts),
                    last_wall=max(st.last_wall for st in sts),
                    processes=len({st.process.key for st in sts}),
                    ranks=sorted({r for st in sts if (r := st.process.rank) is not None}),
                    latest=False,
                )
            self._touched_boots.clear()
            order = sorted(self._boot_summaries.values(), key=lambda b: (b.first_wall, b.boot))
            self._boots = order[:-1] + [replace(b, latest=True) for b in order[-1:]]
        return self._boots

    def view(self) -> FlightView:
        """One copy shared by every reader until the state changes or a series' grace ends."""
        with self._lock:
            now = time.monotonic()
            if self._view is not None and now < self._view[1]:
                return self._view[0]
            # A process's series go at the end of its grace (the API and CLI still show it).
            visible, until = [], math.inf
            for st in self._streams.values():
                ends = self._exited_at.get(st.process, math.inf) + self.exited_grace
                if now < ends:
                    visible.append(st)
                    until = min(until, ends)
            view = FlightView(
                streams=tuple(_copy(st) for st in visible),  # a refresh may append meanwhile
                divergences={boot: dict(by_key) for boot, by_key in self._divergences.items()},
                skipped={reason: self._reader.skipped[reason] for reason in SKIP_REASONS},
                invalid=dict(self._reader.invalid),
                boots=tuple(b.boot for b in self._summaries()),
            )
            self._view = (view, until)
            return view

    def boots(self) -> list[BootSummary]:
        with self._lock:
            return list(self._summaries())

    def flight(self, boot: str | None = None) -> Flight:
        """One boot's records (the latest by default) as a one-shot read gives them."""
        with self._lock:
            boots = list(self._summaries())
            if boot is not None and boot not in self._boot_streams:
                raise BootNotFoundError(boot, [b.boot for b in boots])
            selected = boot if boot is not None else boots[-1].boot if boots else None
            of_boot = self._boot_streams.get(selected, {}) if selected is not None else {}
            streams = sorted(of_boot.values(), key=lambda st: st.file)
            # Each stream's census lines as a reader replays them (its live lines folded).
            records: list[Record] = [
                r for st in streams for r in (*st.marks, *st.census_lines, st.live) if r is not None
            ]
            return Flight(
                records=records,
                boots=boots,
                boot=selected,
                skipped=collections.Counter(self._reader.skipped),
                invalid=collections.Counter(self._reader.invalid),
                alive=dict(self._alive_locked()),
            )

    def alive(self) -> Mapping[tuple[str, int, int | None], bool]:
        """Whether each process this daemon can see still runs, as of the last refresh."""
        with self._lock:
            return MappingProxyType(self._alive_locked())

    def _alive_locked(self) -> dict[tuple[str, int, int | None], bool]:
        # Made again only when the streams or the exits changed: a scrape asks each time.
        if self._running is None:
            out: dict[tuple[str, int, int | None], bool] = {}
            for st in self._streams.values():
                p = st.process
                known = p.host == self._host and p.start_ticks is not None
                if known and self.process_host_pid(p) is not None:
                    out[p.key] = p not in self._exited_at
            self._running = out
        return self._running

    def host_pid(self, rec: Record) -> int | None:
        return self.process_host_pid(rank_process(rec))

    def process_host_pid(self, p: RankProcess) -> int | None:
        # One read of a map a refresh only extends or replaces whole: no lock needed.
        return p.pid if p.pidns == HOST_PIDNS_INODE else self._host_pids.get(p.key)

    def latest_boot(self) -> str | None:
        self.refresh()
        return self.view().latest_boot

    def rank_processes(self) -> list[RankProcess]:
        self.refresh()
        return self.view().rank_processes()

    def _add(self, rec: Record) -> None:
        h = rec.header
        key = (h.file, h.boot)
        st = self._streams.get(key)
        if st is None:
            st = self._streams[key] = StreamState(h.file, h.boot, rank_process(rec), h.wall, h.wall)
            self._boot_streams.setdefault(h.boot, {})[key] = st
        else:
            st.first_wall = min(st.first_wall, h.wall)
            st.last_wall = max(st.last_wall, h.wall)
            st.process = rank_process(rec)  # rank fields may be configured late
        self._touched_boots.add(h.boot)
        p = st.process
        if p.host == self._host and p.start_ticks is not None and p not in self._exited_at:
            since = self._living.get(p, h.wall)
            self._living[p] = None if since is None or self._caught_up else max(since, h.wall)
        body = rec.body
        if isinstance(body, (Census, CensusDump, Divergence)):
            st.census_lines.append(rec)
            del st.census_lines[:-MAX_CENSUS_LINES_PER_PROCESS]
        if isinstance(body, Mark):
            st.arenas = Line(h, body)
            st.marks.append(st.arenas)
            if len(st.marks) > MAX_MARKS_PER_PROCESS:
                if not st.marks_forgotten:
                    log.warning("%s: more than %d marks of boot %s, the daemon keeps the newest "
                                "(the file keeps them all)", h.file, MAX_MARKS_PER_PROCESS, h.boot)  # fmt: skip
                st.marks_forgotten += 1
                del st.marks[0]
        elif isinstance(body, Oom):
            st.ooms.append(Line(h, body))
            del st.ooms[:-MAX_OOMS_PER_PROCESS]
            card = (body.device.nvml_index, body.device.uuid)
            st.oom_counts[card] = st.oom_counts.get(card, 0) + 1
        elif isinstance(body, CensusLive):
            counts = dict(st.live.body.changed) if st.live is not None else {}
            for name, n in body.changed.items():
                counts[name] = max(n, counts.get(name, n))
            st.live = Line(h, CensusLive(counts, body.blocked_in))
        elif isinstance(body, (Census, CensusDump)):
            st.census = Line(h, body)
            # A snapshot whose round or counts do not read compares nothing (the census
            # report skips it too): the rank stays at its last readable one.
            if isinstance(body, Census) and body.round is not None and body.counts is not None:
                st.snapshot = Line(h, body)
        elif isinstance(body, Divergence):
            # The newest comparison round wins, as in the census report.
            by_key = self._divergences.setdefault(h.boot, {})
            held = by_key.get((body.group, body.op))
            if held is None or _round_wall(held) <= _round_wall(Line(h, body)):
                by_key[(body.group, body.op)] = Line(h, body)

    def _forget_missing(self, present: set[str]) -> None:
        """Drops the state of files that are gone, and the host pids no file names."""
        gone = [k for k in self._streams if k[0] not in present]
        for key in gone:
            del self._streams[key]
            boot = key[1]
            self._touched_boots.add(boot)
            del self._boot_streams[boot][key]
            if not self._boot_streams[boot]:
                del self._boot_streams[boot]
        if gone:
            self._boots = self._view = self._running = None
            processes = {st.process for st in self._streams.values()}
            self._exited_at = {p: t for p, t in self._exited_at.items() if p in processes}
            self._living = {p: t for p, t in self._living.items() if p in processes}
            live = {p.key for p in processes}
            self._host_pids = {k: pid for k, pid in self._host_pids.items() if k in live}
        for boot, by_key in list(self._divergences.items()):
            for gk in [gk for gk, line in by_key.items() if line.header.file not in present]:
                del by_key[gk]
            if not by_key:
                del self._divergences[boot]


def newest(
    streams: Iterable[StreamState], line: Callable[[StreamState], Line[B] | None]
) -> list[tuple[StreamState, Line[B]]]:
    """Each stream's ``line`` where it has one, oldest first: keyed by labels, the newest wins."""
    found = [(st, got) for st in streams if (got := line(st)) is not None]
    return sorted(found, key=lambda pair: pair[1].header.wall)


def _copy(st: StreamState) -> StreamState:
    return replace(
        st,
        marks=list(st.marks),
        census_lines=list(st.census_lines),
        ooms=list(st.ooms),
        oom_counts=dict(st.oom_counts),
    )


def _round_wall(line: Line[Divergence]) -> tuple[int, float]:
    round_ = line.body.round
    return (round_ if round_ is not None else -1, line.header.wall)


def host_pids(
    processes: list[RankProcess], proc: str
) -> dict[tuple[str, int, int | None], int | None]:
    """The pid NVML lists for each process of another PID namespace, by its key: found in this
    daemon's /proc (one walk, only when a process can be matched), else None."""
    out: dict[tuple[str, int, int | None], int | None] = dict.fromkeys(p.key for p in processes)
    if any(p.start_ticks is not None for p in processes):
        index = RankIndex(processes)
        for pid in list_pids(proc):
            rp = index.match(read_proc_info(pid, proc))
            if rp is not None and out[rp.key] is None:
                out[rp.key] = pid
    return out
