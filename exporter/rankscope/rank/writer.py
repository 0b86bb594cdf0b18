"""The flight record's writer: who this process is, which boot it belongs to, and one
append-only JSON-lines file per process and stream, ``{stream}-{host}-{pid}-{start_ticks}.jsonl``
(docs/architecture.md, "The record"). Shared by the probe and the census; called from inside
a rank's host program, so it never raises into it nor blocks it: a failed write costs one
warning and a counted drop. A line is its header (rankscope.record.header) and its body's
members, as one compact JSON object, appended with one write."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from rankscope.procfs import read_nspid, read_pidns_inode, read_start_ticks
from rankscope.record import (
    ENV_BOOT_ID,
    ENV_DIR,
    ENV_TORCHELASTIC_RUN_ID,
    Body,
    ProcessIdentity,
    RankIdentity,
)
from rankscope.record.codec import Codec, plan
from rankscope.record.header import header_json

log = logging.getLogger("rankscope")


def json_default(obj: Any) -> Any:
    """What an unencodable value records as: numpy and torch scalars their item, sets a
    list, anything else its text; never a failed line."""
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:  # a tensor of many elements has no single item
            return str(obj)
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    return str(obj)


# No circular check: a cyclic extra ends in RecursionError, a counted drop like any bad value.
ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_default, check_circular=False)


def _value_encoder() -> Callable[[Any], str]:
    """ENCODER.encode without its per-call setup: the stdlib's C encoder, made once."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the _json accelerator
        return ENCODER.encode
    encode = make(None, json_default, encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda value: "".join(encode(value, 0))


encode_json = _value_encoder()

# A value as JSON text: ints, null, strings and bools inline; else as ENCODER writes it.
_SCALAR = (
    '(R(x) if type(x := {}) is int else "null" if x is None else S(x) if type(x) is str'
    ' else "true" if x is True else "false" if x is False else J(x))'
)


@functools.cache
def line_encoder(kind: type[Any]) -> Callable[[Any], str]:
    """The members of a ``kind``'s JSON object as ENCODER writes its ``to_json()``, without the
    braces, by a function generated once from its declared fields, its sections inlined: a
    mark is written at every boot phase, and building its objects as dicts to encode them was
    most of the probe's own cost. A kind of a wire shape of its own encodes its to_json."""
    if kind.to_json is not Codec.to_json:
        return lambda body: encode_json(body.to_json())[1:-1]
    names: dict[str, Any] = {"R": int.__repr__, "S": encode_basestring_ascii, "J": encode_json}
    lines = ["def encode(o):"]

    def members(cls: type, obj: str) -> str:
        parts: list[str] = []
        for name, spec, _ in plan(cls):
            value = f"{obj}.{name}"
            if spec.section is not None and spec.section.to_json is Codec.to_json:
                lines.append(f"    s{len(lines)} = {value}")
                value = f"s{len(lines) - 1}"
                inner = members(spec.section, value)
                value = f"'null' if {value} is None else ''.join(('{{', {inner}, '}}'))"
            elif spec.encode is not None:
                names[f"e{len(names)}"] = spec.encode
                value = f"J(e{len(names) - 1}({value}))"
            else:
                value = _SCALAR.format(value)
            parts.append(f"{',' * bool(parts) + encode_json(name) + ':'!r}, {value}")
        return ", ".join(parts) or "''"

    lines.append(f"    return ''.join(({members(kind, 'o')},))")
    exec("\n".join(lines), names)  # the source holds the kind's field names, nothing else
    return names["encode"]


def current_process() -> ProcessIdentity:
    pid, host = os.getpid(), socket.gethostname()
    return ProcessIdentity(host, pid, read_start_ticks(), read_nspid(), read_pidns_inode())


def rank_from_env() -> RankIdentity:
    return RankIdentity(
        rank=_env_int("RANK"), local_rank=_env_int("LOCAL_RANK"), world_size=_env_int("WORLD_SIZE")
    )


def resolve_boot_id(environ: Mapping[str, str] | None = None, launcher: int | None = None) -> str:
    """RANKSCOPE_BOOT_ID, else TORCHELASTIC_RUN_ID, else derived from the ``launcher`` (by
    default the parent process, which all ranks of one launch share) as every child of it
    derives it: host, pid and start time (so a recycled pid never joins an old boot)."""
    env = os.environ if environ is None else environ
    for name in (ENV_BOOT_ID, ENV_TORCHELASTIC_RUN_ID):
        value = env.get(name)
        if value and value != "none":
            return value
    launcher = os.getppid() if launcher is None else launcher
    start = read_start_ticks(launcher)
    return f"{socket.gethostname()}-{launcher}-{start if start is not None else 'x'}"


def publish_boot_id(environ: dict[str, str] | None = None) -> str:
    """For a launcher about to spawn ranks: fix the boot id in the environment its children
    inherit. Keeps an id already set; otherwise derives one from this process, exactly what
    a child without the variable would derive from its parent."""
    env = os.environ if environ is None else environ
    boot = env[ENV_BOOT_ID] = resolve_boot_id(env, os.getpid())
    return boot


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ.get(name) or "")
    except ValueError:  # unset, empty or not a number
        return None


@dataclass
class _Stream:
    fd: int | None = None
    broken: bool = False  # last write was partial: the next line starts with a newline


@dataclass
class Recorder:
    """Process-wide record state: the flight directory, the identities, one file a stream.
    ``armed`` says whether lines are written (a hot path follows it: follow_armed)."""

    flight_dir: Path | None = None
    rank: RankIdentity = field(default_factory=rank_from_env)
    process: ProcessIdentity = field(default_factory=current_process)
    boot: str = ""
    lines_written: int = 0
    lines_dropped: int = 0
    _streams: dict[str, _Stream] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    # (kind, runner) -> (the identity it was made for, the header's text up to its times)
    _heads: dict[tuple[str, str | None], tuple[Any, str]] = field(default_factory=dict)
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
            self.boot = resolve_boot_id()
        flight_dir = self.flight_dir or os.environ.get(ENV_DIR)
        self.flight_dir = Path(flight_dir) if flight_dir else None
        self.armed = self.flight_dir is not None

    def configure(
        self,
        *,
        flight_dir: str | os.PathLike[str] | None = None,
        boot_id: str | None = None,
        **fields: Any,
    ) -> None:
        """Arguments left at None keep their value; an unknown rank field is a TypeError."""
        with self._lock:
            if flight_dir is not None:
                self.flight_dir = Path(flight_dir)
                self._close_locked()
            if boot_id is not None:
                self.boot = boot_id
            self.rank = replace(self.rank, **{k: v for k, v in fields.items() if v is not None})
            self.armed = self.flight_dir is not None

    def header(self, kind: str) -> dict[str, Any]:
        """The header of a line of ``kind`` written now (rankscope.record.Header)."""
        return header_json(kind, self.boot, self.rank, self.process, time.monotonic(), time.time())

    def _encode(self, body: Body, runner: str | None) -> bytes:
        """``header(body.KIND)`` updated with ``body.to_json()``, as one JSON line, from text:
        the header's, kept while the identity stands, then the times, then the body's members
        (no kind names a header field)."""
        identity = (self.boot, self.rank, self.process)
        head = self._heads.get((body.KIND, runner))
        if head is None or head[0] != identity:
            rank = self.rank if runner is None else replace(self.rank, runner=runner)
            untimed = header_json(body.KIND, self.boot, rank, self.process, None, 0.0)
            del untimed["mono"], untimed["wall"]
            head = self._heads[body.KIND, runner] = (identity, ENCODER.encode(untimed)[:-1])
        kind: type = type(body)  # a union of kinds is no Hashable to mypy
        members = line_encoder(kind)(body)
        times = f'"mono":{time.monotonic()!r},"wall":{time.time()!r}'  # floats as JSON has them
        return f"{head[1]},{times}{',' * bool(members)}{members}}}\n".encode()

    def write_record(self, body: Body, *, runner: str | None = None) -> bool:
        """Append one typed line (rankscope.record) to its kind's stream; ``runner``
        overrides the configured runner in this line's header. Never raises; a failure warns
        once per stream and reason and is counted in ``lines_dropped``."""
        return self._write(body, runner, self._append)

    def write_record_detached(self, body: Body) -> bool:
        """``write_record`` for a signal handler, which may interrupt code holding the
        writer's lock: the line goes through a descriptor of its own, opened, written once
        and closed. A leading newline ends whatever partial line the interrupted write left."""
        return self._write(body, None, self._append_detached)

    def _write(self, body: Body, runner: str | None, append: Callable[[str, bytes], bool]) -> bool:
        if not self._armed:
            return False
        try:
            data = self._encode(body, runner)
        except Exception as exc:  # an unserialisable extra must not reach the host program
            self._drop(body.STREAM, f"encode: {exc!r}")
            return False
        return append(body.STREAM, data)

    def _append(self, stream: str, data: bytes) -> bool:
        with self._lock:
            if (st := self._streams.get(stream)) is None:
                st = self._streams[stream] = _Stream()
            try:
                if st.fd is None:
                    st.fd = self._open(stream)
                if st.broken:
                    data = b"\n" + data
                written = os.write(st.fd, data)
            except OSError as exc:
                self._drop(stream, f"{type(exc).__name__}: {exc.strerror or exc}")
                if st.fd is not None and exc.errno != errno.ENOSPC:  # ENOSPC: space may come back
                    with contextlib.suppress(OSError):
                        os.close(st.fd)
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

    def _append_detached(self, stream: str, data: bytes) -> bool:
        try:
            data = b"\n" + data
            fd = self._open(stream)
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

    def _open(self, stream: str) -> int:
        path = self.path_for(stream)
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: a FIFO or a wedged special file must not hold the host program.
        return os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o644
        )

    def _drop(self, stream: str, reason: str) -> None:
        self.lines_dropped += 1
        # One warning per stream for the disk, one for unencodable payloads: a full disk
        # first fails with a short write, then with ENOSPC, and that is one problem.
        key = stream + (":encode" if reason.startswith("encode") else ":write")
        if key not in self._warned:
            self._warned.add(key)
            what = "rankscope: could not record to the %s stream in %s (%s); carrying on, "
            log.warning(
                what + "further failures are counted silently", stream, self.flight_dir, reason
            )

    def _close_locked(self) -> None:
        for st in self._streams.values():
            if st.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(st.fd)
        self._streams.clear()

    def after_fork_in_child(self) -> None:
        """A forked child is a new process: new identity, new files, same boot."""
        self._lock = threading.Lock()
        self._streams = {}
        self.process = current_process()


RECORDER = Recorder()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RECORDER.after_fork_in_child)
