"""Serving samples: while a rank serves, one ``sample`` line (what a mark measures, without
a phase) every RANKSCOPE_SAMPLE_EVERY seconds (default 10, at least 0.1; 0: none), so the KV
arena's backed bytes are a time series and not only a boot value. A daemon thread takes them,
stopped when the main thread finishes, before the interpreter tears torch down."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from rankscope.rank import env_number, stop_before_teardown
from rankscope.rank.writer import RECORDER
from rankscope.record import Sample

log = logging.getLogger("rankscope")

ENV_EVERY = "RANKSCOPE_SAMPLE_EVERY"
DEFAULT_EVERY_S = 10.0
# The shortest interval taken: the daemon's own sampling period. Each sample is a line in
# every rank's file; 1e-9 would write thousands a second.
MIN_EVERY_S = 0.1


def every_from_env(environ: Any = None) -> float:
    """Seconds between samples; 0 for none. A positive value under MIN_EVERY_S is raised to
    it, with a log line (the caller asks once per process)."""
    every = env_number(ENV_EVERY, DEFAULT_EVERY_S, float, 0.0, environ)
    if 0 < every < MIN_EVERY_S:
        log.warning(
            "rankscope: %s=%g is below the shortest interval; sampling every %g s",
            ENV_EVERY,
            every,
            MIN_EVERY_S,
        )
        return MIN_EVERY_S
    return every


def take() -> Sample | None:
    """Record one sample now; the sample, or None when disarmed or the reads failed."""
    if not RECORDER.armed:
        return None
    from rankscope.rank import probe

    try:
        sample = Sample.of(probe._measure("", {}, probe.TORCH.marked))  # the last mark's card
    except Exception as exc:
        probe._warn_once("sample", f"rankscope: a serving sample failed and was skipped: {exc!r}")
        return None
    RECORDER.write_record(sample)
    return sample


class ServingSampler(threading.Thread):
    def __init__(self, every_s: float) -> None:
        super().__init__(name="rankscope-samples", daemon=True)
        self.every_s, self.stopping = every_s, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            take()


_sampler: ServingSampler | None = None


def start(every_s: float | None = None) -> ServingSampler | None:
    """Start sampling this process (idempotent); None when disarmed or turned off."""
    global _sampler
    if _sampler is not None and _sampler.is_alive():  # a forked child's copy is not
        return _sampler
    if not RECORDER.armed:
        return None
    every_s = every_from_env() if every_s is None else every_s
    # no thread once the interpreter is shutting down
    if every_s <= 0 or not stop_before_teardown(stop):
        return None
    _sampler = ServingSampler(every_s)
    _sampler.start()
    return _sampler


def stop() -> None:
    global _sampler
    sampler, _sampler = _sampler, None
    if sampler is not None:
        sampler.stopping.set()
        with contextlib.suppress(Exception):  # never started, or stopped from its own thread
            sampler.join(5.0)
