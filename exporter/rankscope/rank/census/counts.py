"""The census counters: one dict increment per collective, keyed by (group instance, op).
RANKSCOPE_CENSUS=0, read at import, makes ``count`` a function that does nothing."""

from __future__ import annotations

import collections
import logging
import os

from rankscope.record.naming import Key

log = logging.getLogger("rankscope.census")

ENV_CENSUS = "RANKSCOPE_CENSUS"

ARMED: bool = os.environ.get(ENV_CENSUS, "1").strip().lower() not in ("0", "false", "off", "no")

# Every collective this process issued, per (group instance, op), graph replays included.
COUNTS: collections.defaultdict[Key, int] = collections.defaultdict(int)

# The key counted last, the collective a blocked rank is in (the census watcher reads it).
last_key: Key | None = None

# Census failures (a count, a snapshot, a dump, a watcher poll): counted, never raised.
failures = 0
_warned: set[str] = set()  # the categories whose first failure was logged


def failed(category: str, exc: BaseException, *detail: object) -> None:
    """Count a failure of ``category`` ("count", "dump"...); the first of each is logged with
    ``detail`` (formatted only then, off the hot path), the rest are counted silently."""
    global failures
    failures += 1
    if category not in _warned:
        _warned.add(category)
        log.warning(
            "rankscope census: a %s failed %s: %r; further ones are counted silently",
            category,
            detail,
            exc,
        )


if ARMED:

    def count(group: str, op: str, n: int = 1) -> None:
        """Count ``n`` calls of ``op`` on group instance ``group``. The hot path; never raises."""
        global last_key
        try:
            key = (group, op)
            COUNTS[key] += n
            last_key = key
        except Exception as exc:  # an unhashable group must not reach the host program
            failed("count", exc, group, op)

else:

    def count(group: str, op: str, n: int = 1) -> None:
        """Disarmed by RANKSCOPE_CENSUS=0: counts nothing."""


def snapshot() -> dict[Key, int]:
    """A consistent copy of the counts (the C-level copy holds the GIL throughout)."""
    return dict(COUNTS)


def reset() -> None:
    """Forget every count (tests, or a framework that re-initialises its groups)."""
    global last_key
    COUNTS.clear()
    last_key = None
