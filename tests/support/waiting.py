"""Polling for a condition in tests that drive real threads and processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> Any:
    """The first truthy value ``predicate`` returns; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or 'condition'} not met within {timeout}s")
        time.sleep(interval)
