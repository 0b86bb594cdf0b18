"""What runs inside a host program: the probe, the census, the adapters, the arming and the
writer. Nothing here raises into the host or blocks it. The daemon and the readers never
import this package (tests/test_layout.py checks it in a fresh interpreter)."""

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

N = TypeVar("N", int, float)


def env_number(
    name: str, default: N, convert: Callable[[str], N], least: N, environ: Mapping[str, str] | None
) -> N:
    """The number in ``name`` (``default`` when unset); not a finite number >= ``least``: logged."""
    raw = str((os.environ if environ is None else environ).get(name, "")).strip()
    if not raw:
        return default
    with contextlib.suppress(ValueError):
        value = convert(raw)
        if least <= value < float("inf"):  # NaN is not
            return value
    logging.getLogger("rankscope").warning(
        "rankscope: %s=%r is not a number >= %s; using %s", name, raw, least, default
    )
    return default


def stop_before_teardown(stop: Callable[[], None]) -> bool:
    """Run ``stop`` as the main thread finishes, ahead of atexit and of the interpreter's
    teardown, where a thread of ours still running aborts the process ("terminate called without
    an active exception"), as concurrent.futures does. False when shutting down already."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return False
    try:
        register(stop)
    except RuntimeError:  # shutting down already
        return False
    return True
