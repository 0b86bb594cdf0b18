"""Counting named methods of a framework's coordinator class (SGLang's or vLLM's
GroupCoordinator), given how to read the group instance from ``self``. The thread-local
guard is shared with the torch.distributed patch: a counted call reaching another counted
call on the same thread counts once, under the outermost name.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rankscope.rank.census import counts as _counts
from rankscope.record.naming import RECV, SEND, group_instance, p2p_name

log = logging.getLogger("rankscope.census")

MARK = "__rankscope_census__"

# (self, args after self, kwargs) -> op name, or None: not counted
OpNamer = Callable[[Any, tuple[Any, ...], dict[str, Any]], "str | None"]
GroupOf = Callable[[Any], "str | None"]


class _Guard(threading.local):
    depth = 0


GUARD = _Guard()


class _GroupCache:
    """group_of(self), remembered per instance (weakly), so a call pays one lookup."""

    def __init__(self, group_of: GroupOf) -> None:
        self.group_of = group_of
        self.cache: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()

    def __call__(self, obj: Any) -> str | None:
        try:
            return self.cache[obj]
        except KeyError:
            name = self.group_of(obj)
            self.cache[obj] = name
            return name
        except TypeError:  # not weakly referenceable: no cache
            return self.group_of(obj)


def coordinator_group(coordinator: Any) -> str:
    """The group instance of a GroupCoordinator-shaped object (SGLang, vLLM): the name its
    ``unique_name`` starts with ('tp' of 'tp:0') over its global ``ranks``."""
    base = str(getattr(coordinator, "unique_name", "group")).split(":", 1)[0]
    return group_instance(base, coordinator.ranks)


def coordinator_p2p(kind: str, param: str, position: int) -> OpNamer:
    """Op namer for a coordinator's send/recv whose peer is a group-local index passed as
    ``param`` (or positionally at ``position``, counting after self), defaulting to the next
    rank for a send and the previous one for a recv, as SGLang and vLLM do."""
    if kind not in (SEND, RECV):
        raise ValueError(f"coordinator_p2p: kind must be {SEND!r} or {RECV!r}, not {kind!r}")
    step = 1 if kind == SEND else -1

    def namer(coordinator: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        local = kwargs.get(param, args[position] if len(args) > position else None)
        if local is None:
            local = (coordinator.rank_in_group + step) % coordinator.world_size
        return p2p_name(kind, coordinator.ranks[local])

    return namer


def _method_wrapper(
    original: Callable[..., Any], op: str | OpNamer, group_of: _GroupCache
) -> Callable[..., Any]:
    namer = op if callable(op) else None
    fixed_op = op if isinstance(op, str) else ""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if GUARD.depth:
            return original(self, *args, **kwargs)
        GUARD.depth = 1
        try:
            try:
                group = group_of(self)
                name = namer(self, args, kwargs) if namer is not None else fixed_op
                if group is not None and name is not None:
                    _counts.count(group, name)
            except Exception as exc:  # a naming failure costs a count, never the call
                _counts._count_failed(original.__name__, op, exc)
            return original(self, *args, **kwargs)
        finally:
            GUARD.depth = 0

    setattr(wrapper, MARK, True)
    return wrapper


def instrument_methods(
    cls: type,
    methods: Mapping[str, str | OpNamer] | Iterable[str],
    group_of: GroupOf = coordinator_group,
) -> Callable[[], None]:
    """Count each call of the named methods of ``cls``: ``methods`` maps a method name to
    its op name (or an op namer, for p2p), or lists names counted under their own name;
    ``group_of(self)`` gives the group instance (None: not counted). A method missing or
    already wrapped is skipped with a log line. Returns the undo."""
    table: dict[str, str | OpNamer] = (
        dict(methods) if isinstance(methods, Mapping) else {m: m for m in methods}
    )
    cache = _GroupCache(group_of)
    saved: dict[str, Any] = {}
    for name, op in table.items():
        current = getattr(cls, name, None)
        if current is None or not callable(current):
            log.warning("rankscope census: %s has no method %s; not counted", cls.__name__, name)
            continue
        if getattr(current, MARK, False):
            log.warning("rankscope census: %s.%s is counted already", cls.__name__, name)
            continue
        if isinstance(cls.__dict__.get(name), (staticmethod, classmethod)):
            log.warning(
                "rankscope census: %s.%s is not an instance method; not counted", cls.__name__, name
            )
            continue
        saved[name] = cls.__dict__.get(name, _INHERITED)
        setattr(cls, name, _method_wrapper(current, op, cache))

    def undo() -> None:
        for name, original in saved.items():
            if original is _INHERITED:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        saved.clear()

    return undo


_INHERITED = object()
