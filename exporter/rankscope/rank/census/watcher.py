"""The census watcher: a thread that writes the counts on time, not only at a round, so a hung
rank is named from its record while it hangs (docs/census.md, "Live lines and stalls"). While
the counts move, a ``census_live`` line with what changed, at most every PERIOD_S; once they
have not moved for the stall time, one line naming the collective counted last, the one a
blocked rank is in. It touches no process group and adds nothing to a collective's path."""

from __future__ import annotations

import logging
import threading
import time

from rankscope.rank import env_number, stop_before_teardown
from rankscope.rank.census import counts as _counts
from rankscope.rank.census import snapshots as _snapshots
from rankscope.rank.writer import RECORDER
from rankscope.record import BlockedIn, CensusLive
from rankscope.record.naming import Key

log = logging.getLogger("rankscope.census")

ENV_STALL = "RANKSCOPE_CENSUS_STALL_S"
DEFAULT_STALL_S = 1.0
POLL_S = 0.2
PERIOD_S = 1.0


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
        full = _snapshots.STATE.full_written
        if full is not None and full[0] > self.written_mono:
            self.written_mono, self.written = full
        if counts != self.seen:
            resumed, self.stalled = self.stalled, False
            self.seen, self.progress_mono, self.progress_wall = counts, mono, wall
            if resumed:  # the stall is over: say so at once
                return self._line(counts, mono, None)
        elif not self.stalled and counts and mono - self.progress_mono >= self.stall_s:
            self.stalled = True
            return self._line(counts, mono, self._blocked(counts))
        if counts != self.written and mono - self.written_mono >= self.period_s:
            return self._line(counts, mono, None)
        return None

    def _blocked(self, counts: dict[Key, int]) -> BlockedIn:
        """The collective counted last: the one a rank that stopped counting is in."""
        key = _counts.last_key
        if key is None or key not in counts:
            return BlockedIn(None, None, None, self.progress_wall)
        return BlockedIn(key[0], key[1], counts[key], self.progress_wall)

    def _line(self, counts: dict[Key, int], mono: float, blocked: BlockedIn | None) -> CensusLive:
        changed = {k: n for k, n in counts.items() if self.written.get(k) != n}
        self.written, self.written_mono = counts, mono
        return CensusLive(changed, blocked)


def stall_from_env(environ: dict[str, str] | None = None) -> float:
    return env_number(ENV_STALL, DEFAULT_STALL_S, float, 0.1, environ)


_thread: threading.Thread | None = None
_stop = threading.Event()
failures = 0  # polls that failed: the host program never sees them, the thread carries on


def _run(watcher: Watcher, stop: threading.Event) -> None:
    global failures
    while not stop.wait(POLL_S):
        try:
            line = watcher.poll(time.monotonic(), time.time())
            if line is not None:
                RECORDER.write_record(line)
        except Exception as exc:
            failures += 1
            if failures == 1:
                log.warning("rankscope census: the watcher failed (%r); carrying on", exc)


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
