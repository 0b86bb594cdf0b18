"""Registered memory arenas (KV pools and the like), observed at every mark, held weakly.

The arena protocol (docs/probe.md): ``reserved_bytes`` (address space reserved),
``backed_bytes`` (of it, backed by committed pages) and ``retained_bytes`` (committed, kept
in parked handles), each an int attribute, property or zero-argument method (None: unknown).
A missing or failing count is recorded as null with a why, never as 0."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from rankscope.record import MarkArena

log = logging.getLogger("rankscope")

COUNTS = ("reserved_bytes", "backed_bytes", "retained_bytes")

_registry: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_lock = threading.Lock()  # against changes while snapshot() copies the items


def register(name: str, arena: Any) -> bool:
    """Observe ``arena`` under ``name`` at every mark (a later registration of the same name
    replaces it). Returns False, with one warning, when the arena cannot be held weakly."""
    try:
        with _lock:
            _registry[str(name)] = arena
    except TypeError:
        log.warning(
            "rankscope: arena %r (a %s) cannot be weakly referenced, so it is not observed; "
            "give its class a __weakref__ slot",
            name,
            type(arena).__name__,
        )
        return False
    return True


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(str(name), None)


def registered() -> list[str]:
    """Names of the arenas still alive."""
    with _lock:
        return list(_registry)


def read_count(arena: Any, attr: str) -> tuple[int | None, str | None]:
    """One count of one arena: (bytes, None) or (None, why)."""
    try:
        value = getattr(arena, attr)
        if callable(value):
            value = value()
    except AttributeError:
        return None, f"arena has no {attr}"
    except Exception as exc:
        return None, f"{attr} raised {exc!r}"
    if value is None:
        return None, f"arena reports {attr} as unknown"
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(value)  # numpy and torch integer scalars
        except (TypeError, ValueError, OverflowError):  # inf is an OverflowError, NaN not
            return None, f"{attr} is not a byte count: {value!r}"[:200]
    if value < 0:
        return None, f"{attr} is negative: {value}"
    return value, None


def read_arena(arena: Any) -> MarkArena:
    reads = [read_count(arena, attr) for attr in COUNTS]
    (reserved, _), (backed, _), (retained, _) = reads
    return MarkArena(reserved, backed, retained, "; ".join(why for _, why in reads if why) or None)


def snapshot() -> dict[str, MarkArena]:
    """{name: its bytes} for every live registered arena."""
    if not _registry:  # every mark asks; most processes register none
        return {}
    with _lock:
        items = list(_registry.items())
    return {name: read_arena(arena) for name, arena in items}
