"""Reading flight directories (docs/architecture.md, "The record"): one-shot reads scoped to
a boot, and an incremental tail. What a crash leaves never fails a read: a line is skipped
and counted by reason (SKIP_REASONS); only regular files are read, never blocking; a value
that fails validation is None, counted in ``invalid``."""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rankscope.procfs import HOST_PIDNS_INODE
from rankscope.record import SCHEMA_VERSION, AnyLine, Bad, Header, parse_object
from rankscope.record.codec import nested_deeper_than

Record = AnyLine

SKIP_REASONS = ("torn", "malformed", "newer_schema", "oversized", "too_deep")
FILE_SUFFIX = ".jsonl"
MAX_LINE_BYTES = 4 << 20  # a mark with a large NVML process map is ~10 KiB
READ_CHUNK = 1 << 20
LOG_UNREADABLE_NAMES = 5  # files a poll names as turned unreadable; the rest only counted

log = logging.getLogger("rankscope")


HostPid = Callable[[Record], "int | None"]  # who NVML lists for a record's process


def host_pid(rec: Record) -> int | None:
    """The pid NVML lists for the writer of ``rec`` where the record alone tells (the host
    PID namespace); the daemon resolves the others through the host's /proc."""
    return rec.header.pid if rec.header.pidns == HOST_PIDNS_INODE else None


class BootNotFoundError(LookupError):
    """A boot was asked for by name and the directory holds no record of it."""

    def __init__(self, boot: str, known: list[str]) -> None:
        listed = ", ".join(known) if known else "none"
        shown = boot if len(boot) <= 80 else boot[:80] + "..."  # never echo a huge query
        super().__init__(f"no boot {shown!r} in the flight directory (boots recorded: {listed})")


def parse_line(raw: bytes, file: str = "", bad: Bad | None = None) -> Record | str | None:
    """One line (without its newline) -> the typed record, the skip reason, or None when
    blank. Fields that failed validation are named in ``bad``."""
    text = raw.strip()
    if not text:
        return None
    if nested_deeper_than(text):
        return "too_deep"
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        # A cut-off object still starts like one: that is a torn append, anything else is junk.
        return "torn" if text.startswith(b"{") and not text.endswith(b"}") else "malformed"
    if not isinstance(obj, dict):
        return "malformed"
    version = obj.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return "malformed"
    if version > SCHEMA_VERSION:
        return "newer_schema"
    line = parse_object(obj, [] if bad is None else bad, file)
    return "malformed" if line is None else line


def _flight_files(flight_dir: Path) -> list[str]:
    """The names of the flight files in ``flight_dir``; none while it does not exist."""
    try:
        return [e.name for e in os.scandir(flight_dir) if e.name.endswith(FILE_SUFFIX)]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise OSError(
            exc.errno, f"cannot list flight directory {flight_dir}: {exc.strerror}"
        ) from exc


@functools.cache  # once per file and finding
def _warn_once(path: str, what: str) -> None:
    log.warning("flight file %s %s", path, what)


def _open_regular(path: Path) -> int | None:
    """A descriptor for ``path`` if it is a regular file, else None (logged); non-blocking
    and not following a symlink, so a FIFO renamed in never blocks."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    _warn_once(str(path), "is not a regular file; skipped")
    return None


@dataclass
class _Tail:
    inode: int
    offset: int = 0  # bytes consumed: everything before it was parsed
    pending: bytes = b""  # an unterminated last line, held back until its newline arrives
    oversized: bool = False  # inside a line past MAX_LINE_BYTES: dropped up to its newline


class FlightReader:
    """Incremental tail of a flight directory; the daemon polls it. A poll opens only files
    whose size or inode moved; one replaced in place (new inode, or shorter than what was
    read) is read again from its start and named in ``restarted``, so a holder of its earlier
    records drops them first. A file that cannot be read fails alone: kept in ``unreadable``
    (name -> error), logged when it starts and ends, its read position kept, and tried again
    when it changes or at the next full pass."""

    def __init__(self, flight_dir: str | os.PathLike[str]) -> None:
        self.flight_dir = Path(flight_dir)
        self.skipped: collections.Counter[str] = collections.Counter()
        self.invalid: collections.Counter[str] = collections.Counter()  # per field name
        self.restarted: set[str] = set()
        self.removed: set[str] = set()  # files gone since the previous poll
        self.present: set[str] = set()  # the directory's flight files as last seen
        self.unreadable: dict[str, str] = {}
        self.backlog = 0  # bytes left unread by the last poll (past its budget)
        self.version = 0  # moves whenever a poll read, lost or failed on a file
        self._tails: dict[str, _Tail] = {}
        self._unfinished: set[str] = set()  # files a budget left partly unread

    def poll(self, budget: int | None = None, changed: Iterable[str] | None = None) -> list[Record]:
        """The lines appended since the last poll. ``changed`` names the only files that may
        have changed (a watcher's word); None lists the directory and stats every file. At
        most ``budget`` bytes are read, the rest counted in ``backlog`` for the next poll.
        OSError only when the directory cannot be listed."""
        records: list[Record] = []
        self.restarted, self.removed = set(), set()
        if changed is None:
            names = set(_flight_files(self.flight_dir))
            for gone in self.present - names:
                self._gone(gone)
        else:
            names = {n for n in changed if n.endswith(FILE_SUFFIX)} | self._unfinished
        left = sys.maxsize if budget is None else budget
        self.backlog, self._unfinished = 0, set()
        failed: list[str] = []
        for name in sorted(names):
            try:
                left -= self._poll_name(name, records, left)
            except OSError as exc:
                why = exc.strerror or str(exc)
                if self.unreadable.get(name) != why:  # a retry failing alike changes nothing
                    self.version += 1
                if name not in self.unreadable:
                    failed.append(name)
                self.unreadable[name] = why
        for name in failed[:LOG_UNREADABLE_NAMES]:
            log.warning(
                "flight file %s cannot be read (%s); the other files go on, and it is "
                "tried again when it changes",
                self.flight_dir / name,
                self.unreadable[name],
            )
        if len(failed) > LOG_UNREADABLE_NAMES:
            log.warning(
                "%d more flight files in %s cannot be read",
                len(failed) - LOG_UNREADABLE_NAMES,
                self.flight_dir,
            )
        return records

    def _poll_name(self, name: str, records: list[Record], left: int) -> int:
        """Reads what file ``name`` appended, at most ``left`` bytes; the bytes read."""
        path = self.flight_dir / name
        try:
            st = path.lstat()
        except FileNotFoundError:
            self._gone(name)
            return 0
        if stat.S_ISLNK(st.st_mode):
            _warn_once(str(path), "is a symlink; not followed")
            if name in self.present:  # a file replaced by a link
                self._gone(name)
            return 0
        self.present.add(name)
        tail = self._current(name, st)
        unread = st.st_size - (tail.offset if tail else 0)
        if unread <= 0 and tail is not None:
            return 0  # unchanged: not even opened
        read = 0
        if left > 0:
            self.version += 1
            read = self._poll_file(path, records, left)
            if self.unreadable.pop(name, None) is not None:
                log.warning("flight file %s is readable again", path)
        if read < unread or left == 0:  # the rest waits for the next poll
            self.backlog += unread - read
            self._unfinished.add(name)
        return read

    def _gone(self, name: str) -> None:
        self.version += 1
        self.present.discard(name)
        self._tails.pop(name, None)
        self.unreadable.pop(name, None)
        self.removed.add(name)

    def _current(self, name: str, st: os.stat_result) -> _Tail | None:
        """The tail of file ``name`` unless the file was replaced since (or is new)."""
        tail = self._tails.get(name)
        if tail is None or tail.inode != st.st_ino or st.st_size < tail.offset:
            return None
        return tail

    def _poll_file(self, path: Path, records: list[Record], budget: int) -> int:
        """Reads what ``path`` appended, at most ``budget`` bytes; the bytes read."""
        if (fd := _open_regular(path)) is None:
            return 0
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            tail = self._current(path.name, st)
            if tail is None:
                if path.name in self._tails:
                    self.restarted.add(path.name)
                tail = self._tails[path.name] = _Tail(inode=st.st_ino)
            f.seek(tail.offset)
            # Bounded chunks: memory stays capped whatever one poll finds.
            read = 0
            while tail.offset < st.st_size and read < budget:
                data = f.read(min(st.st_size - tail.offset, READ_CHUNK, budget - read))
                if not data:
                    break
                tail.offset += len(data)
                read += len(data)
                self._take(tail, data, path.name, records)
            return read

    def _take(self, tail: _Tail, data: bytes, name: str, records: list[Record]) -> None:
        """Parses the complete lines ``data`` ends, holding back its unterminated rest."""
        if tail.oversized:  # the rest of a dropped line, up to its newline
            end = data.find(b"\n")
            if end < 0:
                return
            data, tail.oversized = data[end + 1 :], False
        *lines, rest = (tail.pending + data).split(b"\n")
        bad: Bad = []
        for raw in lines:
            parsed = parse_line(raw, name, bad) if len(raw) <= MAX_LINE_BYTES else "oversized"
            if isinstance(parsed, str):
                self._skip(name, parsed)
            elif parsed is not None:
                records.append(parsed)
        self.invalid.update(bad)
        tail.pending = rest
        if len(rest) > MAX_LINE_BYTES:
            self._skip(name, "oversized")
            tail.pending, tail.oversized = b"", True

    def _skip(self, name: str, reason: str) -> None:
        self.skipped[reason] += 1
        _warn_once(name, f"has {reason} lines; skipped and counted")


@dataclass
class BootSummary:
    boot: str
    first_wall: float
    last_wall: float
    processes: int
    ranks: list[int]
    latest: bool

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Flight:
    records: list[Record]  # of the selected boot(s), in file order per process
    boots: list[BootSummary]  # every boot in the directory, oldest first
    boot: str | None  # the selected boot (None when all_boots or the directory is empty)
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)
    invalid: collections.Counter[str] = field(default_factory=collections.Counter)
    unreadable: dict[str, str] = field(default_factory=dict)  # file name -> why, left out
    # Per process (host, pid, start ticks), whether it still runs, where the reader knows it
    # (the daemon); None: a one-shot read, which judges from /proc itself.
    alive: dict[tuple[str, int, int | None], bool] | None = None


def summarize_boots(records: Iterable[Record]) -> list[BootSummary]:
    """Every boot among ``records``, oldest first (by its first record's wall time)."""
    headers: dict[str, list[Header]] = collections.defaultdict(list)
    for rec in records:
        headers[rec.header.boot].append(rec.header)
    boots = [
        BootSummary(
            boot=boot,
            first_wall=min(h.wall for h in hs),
            last_wall=max(h.wall for h in hs),
            processes=len({h.process_key for h in hs}),
            ranks=sorted({h.rank for h in hs if h.rank is not None}),
            latest=False,
        )
        for boot, hs in headers.items()
    ]
    boots.sort(key=lambda b: (b.first_wall, b.boot))
    if boots:
        boots[-1].latest = True
    return boots


def read_flight(
    flight_dir: str | os.PathLike[str], *, boot: str | None = None, all_boots: bool = False
) -> Flight:
    """Read a flight directory once: the latest boot by default, a named boot on request
    (BootNotFoundError when absent), every boot only with ``all_boots``."""
    if boot is not None and all_boots:
        raise ValueError("read_flight: pass either boot= or all_boots=True, not both")
    root = Path(flight_dir)
    if not root.exists():
        raise FileNotFoundError(f"flight directory {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"flight directory {root} is not a directory")
    # One full pass of the tail: a file failing partway keeps the lines read before it.
    reader = FlightReader(root)
    records = reader.poll()
    # A last line with no newline: the append never finished, whatever its bytes parse as.
    reader.skipped.update("torn" for tail in reader._tails.values() if tail.pending.strip())
    boots = summarize_boots(records)
    selected = None
    if not all_boots:
        known = [b.boot for b in boots]
        if boot is not None and boot not in known:
            raise BootNotFoundError(boot, known)
        selected = boot if boot is not None else (known[-1] if known else None)
        records = [r for r in records if r.header.boot == selected]
    return Flight(records, boots, selected, reader.skipped, reader.invalid, reader.unreadable)
