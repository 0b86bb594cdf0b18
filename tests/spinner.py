"""Whether other Python threads run while a call is in C: a spinner thread stamps the clock
as fast as it can around the call (tests of which NVML calls keep the GIL)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def stamps_around(call: Callable[[], Any]) -> tuple[list[float], float, float, Any]:
    """(the spinner's stamps, the call's start and end, what it returned)."""
    stamps: list[float] = []
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.02)
        start = time.perf_counter()
        returned = call()
        end = time.perf_counter()
    finally:
        stop.set()
        spinner.join()
    return stamps, start, end, returned
