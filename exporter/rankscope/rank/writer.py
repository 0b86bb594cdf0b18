"""The flight record: who this process is, which boot it belongs to, and the durable writer.

Shared by the probe (marks) and the census (snapshots, dumps). Everything here is called
from inside a rank's host program, so nothing here raises into it and nothing blocks it:
a failed write costs one warning and a counted drop, never an exception.

File layout (docs/architecture.md, "The record"): one append-only JSON-lines file per
process and stream, named ``{stream}-{host}-{pid}-{start_ticks}.jsonl``; every line is one
JSON object carrying ``v`` (SCHEMA_VERSION), ``kind``, the boot id, the rank identity and
the process identity.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rankscope.procfs import read_nspid, read_pidns_inode, read_start_ticks
from rankscope.record import (
    ENV_BOOT_ID,
    ENV_DIR,
    ENV_TORCHELASTIC_RUN_ID,
    Body,
    Header,
    times_text,
)
from rankscope.record import SCHEMA_VERSION as SCHEMA_VERSION
from rankscope.record import dumps as _dumps

log = logging.getLogger("rankscope")


# --- process identity -------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessIdentity:
    """Who wrote a record: pid plus start time is the identity, never the rank."""

    host: str
    pid: int
    start_ticks: int | None
    nspid: tuple[int, ...] | None
    pidns: int | None

    @classmethod
    def current(cls) -> ProcessIdentity:
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            start_ticks=read_start_ticks(),
            nspid=read_nspid(),
            pidns=read_pidns_inode(),
        )

    def fields(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "nspid": list(self.nspid) if self.nspid is not None else None,
            "pidns": self.pidns,
        }


# --- boot id ----------------------------------------------------------------------------


def derived_boot_id(launcher_pid: int, host: str | None = None) -> str:
    """The boot id every child of one launcher derives alike: host, launcher pid and the
    launcher's start time (so a recycled pid never joins an old boot)."""
    host = host or socket.gethostname()
    start = read_start_ticks(launcher_pid)
    return f"{host}-{launcher_pid}-{start if start is not None else 'x'}"


def resolve_boot_id(environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(boot id, where it came from): RANKSCOPE_BOOT_ID, else TORCHELASTIC_RUN_ID, else
    derived from the parent process, which all ranks of one launch share."""
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_BOOT_ID)
    if explicit:
        return explicit, "env:" + ENV_BOOT_ID
    elastic = env.get(ENV_TORCHELASTIC_RUN_ID)
    if elastic and elastic != "none":
        return elastic, "env:" + ENV_TORCHELASTIC_RUN_ID
    return derived_boot_id(os.getppid()), "parent"


def publish_boot_id(environ: dict[str, str] | None = None) -> str:
    """For a launcher about to spawn ranks: fix the boot id in the environment its children
    inherit. Keeps an id already set; otherwise derives one from this process, exactly what
    a child without the variable would derive from its parent."""
    env = os.environ if environ is None else environ
    for name in (ENV_BOOT_ID, ENV_TORCHELASTIC_RUN_ID):
        value = env.get(name)
        if value and value != "none":
            env[ENV_BOOT_ID] = value
            return value
    boot = derived_boot_id(os.getpid())
    env[ENV_BOOT_ID] = boot
    return boot


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


# --- rank identity and the writer ---------------------------------------------------------


@dataclass
class RankIdentity:
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    runner: str | None = None

    @classmethod
    def from_env(cls) -> RankIdentity:
        return cls(
            rank=_env_int("RANK"),
            local_rank=_env_int("LOCAL_RANK"),
            world_size=_env_int("WORLD_SIZE"),
        )


@dataclass
class _Stream:
    fd: int | None = None
    path: Path | None = None
    broken: bool = False  # last write was partial: the next line starts with a newline


@dataclass
class Recorder:
    """Process-wide record state: the flight directory, the identities, one file a stream.

    ``armed`` says whether lines are written; a hot path that cannot afford even an
    attribute read follows it through :meth:`follow_armed`. Change the identity through
    configure() only: the encoded header is cached until then.
    """

    flight_dir: Path | None = None
    rank: RankIdentity = field(default_factory=RankIdentity.from_env)
    process: ProcessIdentity = field(default_factory=ProcessIdentity.current)
    boot: str = ""
    boot_source: str = ""
    lines_written: int = 0
    lines_dropped: int = 0
    _streams: dict[str, _Stream] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    _prefixes: dict[Any, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _armed: bool = False
    _armed_followers: list[Callable[[bool], None]] = field(default_factory=list)

    @property
    def armed(self) -> bool:
        return self._armed

    @armed.setter
    def armed(self, value: bool) -> None:
        self._armed = bool(value)
        for follower in self._armed_followers:
            follower(self._armed)

    def follow_armed(self, follower: Callable[[bool], None]) -> None:
        """Call ``follower(armed)`` now and whenever ``armed`` changes (the disarmed mark
        reads a module-level copy: on Python 3.12 an attribute read is a third of its cost)."""
        self._armed_followers.append(follower)
        follower(self._armed)

    def __post_init__(self) -> None:
        if not self.boot:
            self.boot, self.boot_source = resolve_boot_id()
        if self.flight_dir is None:
            env_dir = os.environ.get(ENV_DIR)
            self.flight_dir = Path(env_dir) if env_dir else None
        else:
            self.flight_dir = Path(self.flight_dir)
        self.armed = self.flight_dir is not None

    def configure(
        self,
        *,
        flight_dir: str | os.PathLike[str] | None = None,
        boot_id: str | None = None,
        **rank_fields: Any,
    ) -> None:
        with self._lock:
            if flight_dir is not None:
                self.flight_dir = Path(flight_dir)
                self._close_locked()
            if boot_id is not None:
                self.boot, self.boot_source = boot_id, "configure"
            for name, value in rank_fields.items():
                if not hasattr(self.rank, name):
                    raise TypeError(f"configure() got an unknown rank field {name!r}")
                setattr(self.rank, name, value)
            self.armed = self.flight_dir is not None
            self._prefixes = {}

    def header(self, kind: str) -> dict[str, Any]:
        """The header of a line of ``kind`` written now (rankscope.record.schema.Header)."""
        r, p = self.rank, self.process
        return Header(
            v=SCHEMA_VERSION,
            kind=kind,
            boot=self.boot,
            rank=r.rank,
            local_rank=r.local_rank,
            world_size=r.world_size,
            tp_rank=r.tp_rank,
            pp_rank=r.pp_rank,
            runner=r.runner,
            host=p.host,
            pid=p.pid,
            start_ticks=p.start_ticks,
            nspid=p.nspid,
            pidns=p.pidns,
            mono=time.monotonic(),
            wall=time.time(),
        ).to_json()

    def _encode(self, kind: str, payload: dict[str, Any]) -> bytes:
        """header(kind) updated with payload, as one JSON line. The header's fixed fields are
        encoded once per kind (and per header override, such as a mark's runner), since a
        mark pays for every microsecond spent here."""
        overrides = payload.keys() & _FIXED_HEADER
        if "mono" in payload or "wall" in payload:
            line = self.header(kind)
            line.update(payload)
            return (_dumps(line) + "\n").encode()
        try:
            key: Any = (kind, *sorted((k, payload[k]) for k in overrides))
            prefix = self._prefixes.get(key)
        except TypeError:  # an unhashable override: encode it in full
            key, prefix = None, None
        if prefix is None:
            prefix = self._new_prefix(key, kind, [(k, payload[k]) for k in overrides])
        body = _dumps(
            {k: v for k, v in payload.items() if k not in overrides} if overrides else payload
        )
        rest = "}" if body == "{}" else "," + body[1:]
        return (prefix + times_text() + rest + "\n").encode()

    def _new_prefix(self, key: Any, kind: str, overrides: Iterable[tuple[str, Any]]) -> str:
        """The line of ``kind`` up to its times: the header's fixed fields with ``overrides``
        (a mark's runner), encoded and kept under ``key`` (None: an unhashable override, not
        kept)."""
        fixed = self.header(kind)
        del fixed["mono"], fixed["wall"]
        fixed.update(overrides)
        prefix = _dumps(fixed)[:-1]
        if key is not None:
            self._prefixes[key] = prefix
        return prefix

    def _line_prefix(self, kind: str, runner: str | None) -> str:
        """The cached header prefix of ``kind`` (same cache and key as ``_encode``), for a
        body that encodes its own line (rankscope.record.schema.Mark.encode_line)."""
        key = (kind,) if runner is None else (kind, ("runner", runner))
        return self._prefixes.get(key) or self._new_prefix(key, kind, key[1:])

    def write(self, stream: str, kind: str, payload: dict[str, Any]) -> bool:
        """Append one line to this process's file for ``stream``. Never raises; a failure
        warns once per stream and reason and is counted in ``lines_dropped``."""
        if not self._armed:
            return False
        try:
            data = self._encode(kind, payload)
        except Exception as exc:  # an unserialisable extra must not reach the host program
            self._drop(stream, f"encode: {exc!r}")
            return False
        return self._append(stream, data)

    def _append(self, stream: str, data: bytes) -> bool:
        with self._lock:
            st = self._streams.get(stream)
            if st is None:
                st = self._streams[stream] = _Stream()
            try:
                if st.fd is None:
                    st.fd, st.path = self._open_locked(stream)
                if st.broken:
                    data = b"\n" + data
                written = os.write(st.fd, data)
            except OSError as exc:
                self._drop(stream, f"{type(exc).__name__}: {exc.strerror or exc}")
                if (
                    st.fd is not None and exc.errno != errno.ENOSPC
                ):  # keep the fd: space may come back
                    _close_quietly(st.fd)
                    st.fd = None
                return False
            except Exception as exc:  # never into the host program, whatever went wrong
                self._drop(stream, f"{type(exc).__name__}: {exc}")
                return False
            st.broken = written != len(data)
            if st.broken:
                self._drop(stream, "short write: the filesystem is probably full")
                return False
            self.lines_written += 1
            return True

    def write_record(self, body: Body, *, runner: str | None = None) -> bool:
        """Append one typed line (rankscope.record.schema) to its kind's stream; ``runner``
        overrides the configured runner in this line's header. Never raises."""
        if not self._armed:
            return False
        encode_line = getattr(body, "encode_line", None)
        if encode_line is not None and (runner is None or type(runner) is str):
            try:
                data = encode_line(self._line_prefix(body.KIND, runner))
            except Exception as exc:  # an unserialisable extra must not reach the host program
                self._drop(body.STREAM, f"encode: {exc!r}")
                return False
            return self._append(body.STREAM, data)
        try:
            payload = body.to_json()
        except Exception as exc:
            self._drop(body.STREAM, f"encode: {exc!r}")
            return False
        if runner is not None:
            payload["runner"] = runner
        return self.write(body.STREAM, body.KIND, payload)

    def write_record_detached(self, body: Body) -> bool:
        """``write_record`` for a signal handler (see ``write_detached``)."""
        if not self.armed:
            return False
        try:
            payload = body.to_json()
        except Exception as exc:
            self._drop(body.STREAM, f"encode: {exc!r}")
            return False
        return self.write_detached(body.STREAM, body.KIND, payload)

    def write_detached(self, stream: str, kind: str, payload: dict[str, Any]) -> bool:
        """``write`` for a signal handler, which may interrupt code holding the writer's lock:
        the same line through a descriptor of its own, opened, written once and closed. A
        leading newline ends whatever partial line the interrupted write left. Never raises."""
        if not self.armed:
            return False
        try:
            data = b"\n" + self._encode(kind, payload)
            path = self.path_for(stream)
            assert path is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(path, flags, 0o644)
            try:
                written = os.write(fd, data) == len(data)
            finally:
                os.close(fd)
        except Exception as exc:
            self._drop(stream, f"{type(exc).__name__}: {exc}")
            return False
        if written:
            self.lines_written += 1
        return written

    def path_for(self, stream: str) -> Path | None:
        if self.flight_dir is None:
            return None
        p = self.process
        return self.flight_dir / f"{stream}-{p.host}-{p.pid}-{p.start_ticks}.jsonl"

    def _open_locked(self, stream: str) -> tuple[int, Path]:
        path = self.path_for(stream)
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: a FIFO or a wedged special file must not hold the host program.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
        return os.open(path, flags, 0o644), path

    def _drop(self, stream: str, reason: str) -> None:
        self.lines_dropped += 1
        # One warning per stream for the disk, one for unencodable payloads: a full disk
        # first fails with a short write, then with ENOSPC, and that is one problem.
        key = stream + (":encode" if reason.startswith("encode") else ":write")
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "rankscope: could not record to the %s stream in %s (%s); carrying on, "
                "further failures are counted silently",
                stream,
                self.flight_dir,
                reason,
            )

    def _close_locked(self) -> None:
        for st in self._streams.values():
            if st.fd is not None:
                _close_quietly(st.fd)
        self._streams.clear()

    def after_fork_in_child(self) -> None:
        """A forked child is a new process: new identity, new files, same boot."""
        self._lock = threading.Lock()
        self._streams = {}
        self._prefixes = {}
        self.process = ProcessIdentity.current()


# Header fields that stay fixed between configure() calls; mono and wall change per line.
_FIXED_HEADER = frozenset(
    [
        "v",
        "kind",
        "boot",
        *(f.name for f in fields(RankIdentity)),
        *(f.name for f in fields(ProcessIdentity)),
    ]
)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


RECORDER = Recorder()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RECORDER.after_fork_in_child)
