"""The census lines a rank writes. ``tick()`` runs once per scheduler iteration, a replicated
point, so its round agrees across ranks: every N rounds the rank appends a ``census`` line and
hands the counts to the in-process comparison. The watcher thread writes them on time too, so a
hung rank is named from its record while it hangs (docs/census.md). ``dump_local()`` and the
abort handlers write the local counts with no collective (a peer is probably dead by then)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from rankscope.rank import env_number, stop_before_teardown
from rankscope.rank.census import counts as _counts
from rankscope.rank.census import graphs as _graphs
from rankscope.rank.writer import RECORDER
from rankscope.record import BlockedIn, Census, CensusDump, CensusLive
from rankscope.record.naming import Key

ENV_EVERY = "RANKSCOPE_CENSUS_EVERY"
DEFAULT_EVERY = 50
ENV_STALL = "RANKSCOPE_CENSUS_STALL_S"
DEFAULT_STALL_S = 1.0
POLL_S = 0.2
PERIOD_S = 1.0


def every_from_env(environ: dict[str, str] | None = None) -> int:
    return env_number(ENV_EVERY, DEFAULT_EVERY, int, 1, environ)


def stall_from_env(environ: dict[str, str] | None = None) -> float:
    return env_number(ENV_STALL, DEFAULT_STALL_S, float, 0.1, environ)


class _State:
    round = 0
    every = every_from_env()
    auto_every: int | None = None
    # The in-process comparison's submit(round, counts), when enabled (census.gloo).
    on_snapshot: Callable[[int, dict[Key, int]], None] | None = None
    # An explicit tick() was seen: the framework drives the rounds, auto_tick() stands down.
    explicit = False
    # (monotonic time, counts) of the newest census line: the watcher's next line carries
    # only what changed since.
    full_written: tuple[float, dict[Key, int]] | None = None
    handlers_installed = False
    signal_dumped = False


STATE = _State()


def configure(*, every: int | None = None, auto_every: int | None = None) -> None:
    """Set the snapshot cadence in ticks (alike on every rank), or in world collectives
    (``auto_every``, auto_tick's) until a tick()."""
    for value in (every, auto_every):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"census every must be a positive integer, not {value!r}")
    if every is not None:
        STATE.every = every
    if auto_every is not None:
        STATE.auto_every = auto_every
        if not STATE.explicit:
            STATE.every = auto_every


def current_round() -> int:
    return STATE.round


def tick() -> None:
    """Once per scheduler iteration, on every rank. Never raises, never blocks."""
    if not _counts.ARMED:
        return
    if not STATE.explicit:
        STATE.explicit = True
        if STATE.auto_every is not None and STATE.every == STATE.auto_every:
            STATE.every = every_from_env()  # back to a cadence in scheduler iterations
    _advance()


def auto_tick() -> None:
    """``rankscope run``'s cadence: each world-group collective, until the program's tick()."""
    if not STATE.explicit:
        _advance()


def _advance() -> None:
    STATE.round += 1
    if STATE.round % STATE.every:
        return
    try:
        if not STATE.handlers_installed:
            install_abort_handlers()
        take_snapshot()
    except Exception as exc:
        _counts.failed("snapshot", exc)


def take_snapshot() -> dict[Key, int]:
    """Record the counts at the current round (and hand them to the comparison)."""
    counts = _counts.snapshot()
    if RECORDER.armed and RECORDER.write_record(
        Census(STATE.round, STATE.every, counts, _graphs.graph_counts())
    ):
        STATE.full_written = (time.monotonic(), counts)
    hook = STATE.on_snapshot
    if hook is not None:
        hook(STATE.round, counts)
    return counts


def dump_local(reason: str = "manual", write: Callable[[CensusDump], bool] | None = None) -> bool:
    """Write this rank's counts now, with no collective. True when a line was written."""
    if not _counts.ARMED or not RECORDER.armed:
        return False
    try:
        dump = CensusDump(
            round=STATE.round,
            every=STATE.every,
            counts=_counts.snapshot(),
            graphs=_graphs.graph_counts(),
            reason=reason,
        )
        return (write or RECORDER.write_record)(dump)
    except Exception as exc:
        _counts.failed("dump", exc)
        return False


# --- the watcher: the counts on time, and the collective a stalled rank is in ---------------


class Watcher:
    """What the watcher knows between polls; ``poll`` is one step (tests drive it directly)."""

    def __init__(self, stall_s: float, period_s: float = PERIOD_S) -> None:
        self.stall_s = stall_s
        self.period_s = period_s
        self.written: dict[Key, int] = {}  # the counts as this process's live lines left them
        self.seen: dict[Key, int] = {}  # the counts at the previous poll
        self.progress_mono = time.monotonic()
        self.progress_wall = time.time()
        self.written_mono = float("-inf")
        self.stalled = False  # the stall line of the current stall is written

    def poll(self, mono: float, wall: float) -> CensusLive | None:
        """The line to write now, if any, given the counts now."""
        counts = _counts.snapshot()
        # A census line newer than this watcher's last line holds every count: the next live
        # line carries only what changed after it, a period after it.
        full = STATE.full_written
        if full is not None and full[0] > self.written_mono:
            self.written_mono, self.written = full
        if counts != self.seen:
            resumed, self.stalled = self.stalled, False
            self.seen, self.progress_mono, self.progress_wall = counts, mono, wall
            if resumed:  # the stall is over: say so at once
                return self._line(counts, mono, None)
        elif not self.stalled and counts and mono - self.progress_mono >= self.stall_s:
            self.stalled = True
            key = _counts.last_key  # the collective counted last: the one a blocked rank is in
            if key is None or key not in counts:
                return self._line(counts, mono, BlockedIn(None, None, None, self.progress_wall))
            return self._line(counts, mono, BlockedIn(*key, counts[key], self.progress_wall))
        if counts != self.written and mono - self.written_mono >= self.period_s:
            return self._line(counts, mono, None)
        return None

    def _line(self, counts: dict[Key, int], mono: float, blocked: BlockedIn | None) -> CensusLive:
        changed = {k: n for k, n in counts.items() if self.written.get(k) != n}
        self.written, self.written_mono = counts, mono
        return CensusLive(changed, blocked)


_thread: threading.Thread | None = None
_stop = threading.Event()


def _run(watcher: Watcher, stop: threading.Event) -> None:
    while not stop.wait(POLL_S):
        try:
            line = watcher.poll(time.monotonic(), time.time())
            if line is not None:
                RECORDER.write_record(line)
        except Exception as exc:  # the host program never sees it; the thread carries on
            _counts.failed("watcher", exc)


def start_watcher(stall_s: float | None = None) -> bool:
    """Start the watcher (idempotent); False when disarmed or shutting down."""
    global _thread, _stop
    if not _counts.ARMED:
        return False
    if _thread is not None and _thread.is_alive():
        return True
    watcher = Watcher(stall_from_env() if stall_s is None else stall_s)
    stop = threading.Event()
    thread = threading.Thread(
        target=_run, args=(watcher, stop), name="rankscope-census-watcher", daemon=True
    )
    if not stop_before_teardown(stop_watcher):
        return False
    _thread, _stop = thread, stop
    thread.start()
    return True


def stop_watcher() -> None:
    """Stop the watcher and wait for it (ahead of the interpreter's teardown)."""
    global _thread
    thread, _thread = _thread, None
    _stop.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=2.0)


# --- abort handlers --------------------------------------------------------------------------

_previous: dict[int, Any] = {}  # each signal handled, with the handler it had before
_dump_lock = threading.Lock()
_relay: tuple[int, int, threading.Thread] | None = None  # the wakeup pipe, its reader


def _dump_for(signum: int) -> None:
    """One dump, by whichever thread hears of the signal first; detached: the interrupted code
    may hold the recorder's lock. A signal inside the dump's own handler waits a second, no more."""
    if _dump_lock.acquire(timeout=1.0):
        try:
            if not STATE.signal_dumped:
                name = signal.Signals(signum).name
                STATE.signal_dumped = dump_local(name, RECORDER.write_record_detached)
        finally:
            _dump_lock.release()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _dump_for(signum)
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    else:
        _end_by_default(signum)


def _end_by_default(signum: int, set_handler: Callable[[int, Any], Any] = signal.signal) -> None:
    """End the process as the signal would have."""
    set_handler(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _relay_signals(read_fd: int, set_handler: Callable[[int, Any], Any]) -> None:
    """CPython's C handler writes each signal's number to the wakeup fd at once, from whatever
    thread takes it; the Python handler waits for the main thread to run Python, which a rank
    blocked in a hung collective never does. So the dump is written here, and a default action
    (SIGTERM's: end the process) is taken here, as it would be without rankscope."""
    with contextlib.suppress(OSError):
        while heard := os.read(read_fd, 64):
            for signum in heard:
                if signum == 0:  # the stop byte
                    return
                if signum in _previous and signal.getsignal(signum) is _on_signal:
                    try:
                        _dump_for(signum)
                        if not callable(_previous[signum]):  # a program's handler runs as before
                            _end_by_default(signum, set_handler)
                    except Exception as exc:
                        _counts.failed("signal relay", exc)


def _start_relay() -> None:
    """The relay takes the wakeup fd only where the program has none (an asyncio loop's main
    thread runs Python anyway)."""
    global _relay
    import ctypes  # Python sets a handler on the main thread only; the C library anywhere

    set_handler = ctypes.CDLL(None).signal
    set_handler.argtypes, set_handler.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    theirs = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if theirs != -1 or not stop_before_teardown(_stop_relay):
        signal.set_wakeup_fd(theirs)
        for fd in (read_fd, write_fd):
            os.close(fd)
        return
    relay = threading.Thread(
        target=_relay_signals, args=(read_fd, set_handler), name="rankscope-signals", daemon=True
    )
    relay.start()  # before it is recorded: a relay that never started is never joined
    _relay = read_fd, write_fd, relay
    os.register_at_fork(after_in_child=lambda: _stop_relay(in_child=True))


def _stop_relay(in_child: bool = False) -> None:
    """Stop the relay ahead of teardown; in a forked child, let the parent's pipe go (a byte
    written there would reach the parent's relay)."""
    global _relay
    relay, _relay = _relay, None
    if relay is None:
        return
    read_fd, write_fd, thread = relay
    with contextlib.suppress(ValueError):  # off the main thread: nothing to give back
        theirs = signal.set_wakeup_fd(-1)
        if theirs != write_fd:  # the program set its own since
            signal.set_wakeup_fd(theirs)
    if not in_child:
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")
        thread.join(timeout=2.0)
    for fd in (read_fd, write_fd):
        os.close(fd)


def _at_exit() -> None:
    if not STATE.signal_dumped:
        dump_local("exit")


def install_abort_handlers() -> bool:
    """Dump the local counts on SIGTERM, a delivered SIGABRT and at exit; a previous handler
    runs after the dump, an ignored signal stays ignored, a default action stays the process's
    end at once, even while the main thread is blocked in a collective (the relay). Off the main
    thread only the exit dump is installed (returns False)."""
    if STATE.handlers_installed:
        return True
    STATE.handlers_installed = True
    atexit.register(_at_exit)
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in (signal.SIGTERM, signal.SIGABRT):
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN or previous is None or previous is _on_signal:
            continue
        _previous[sig] = previous
        signal.signal(sig, _on_signal)
    try:
        if _previous:
            _start_relay()
    except Exception as exc:  # the handlers stand without it
        _counts.failed("signal relay", exc)
    return True


def reset() -> None:
    """Back to round 0 (tests)."""
    STATE.round = 0
    STATE.explicit = False
    STATE.signal_dumped = False
    STATE.full_written = None
