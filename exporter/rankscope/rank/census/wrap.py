"""Counting named methods of a framework's coordinator class (SGLang's or vLLM's
GroupCoordinator). The thread-local guard, shared with the torch.distributed patch, counts
nested counted calls once, under the outermost name; a call that raises is taken back. Traced
by torch.compile, a call counts through the custom op ``rankscope::census_count``, which the
compiled graph runs on every call (docs/integrations.md)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from rankscope.rank.census import counts as _counts
from rankscope.rank.imports import after_import
from rankscope.record.naming import RECV, SEND, group_instance, p2p_name

log = logging.getLogger("rankscope.census")

MARK = "__rankscope_census__"

# (self, args after self, kwargs) -> op name, or None: not counted
OpNamer = Callable[[Any, tuple[Any, ...], dict[str, Any]], "str | None"]
GroupOf = Callable[[Any], "str | None"]


class _Guard(threading.local):
    depth = 0


GUARD = _Guard()

_NOT_OWN = object()


def patch(owner: Any, name: str, value: Any) -> Callable[[], None]:
    """Set ``owner.name`` (a class or module) to ``value``; the undo restores it exactly: the
    owner's own attribute put back, an inherited or absent one deleted again."""
    saved = vars(owner).get(name, _NOT_OWN)  # a class's inherited attribute is not its own
    setattr(owner, name, value)

    def undo() -> None:
        if saved is _NOT_OWN:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        else:
            setattr(owner, name, saved)

    return undo


def undo_all(undos: list[Callable[[], None]]) -> Callable[[], None]:
    """One undo for several patches, run last first; each runs once."""

    def undo() -> None:
        while undos:
            undos.pop()()

    return undo


def _cached(group_of: GroupOf) -> GroupOf:
    """group_of(self), remembered per instance (weakly), so a call pays one lookup."""
    cache: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()

    def cached(obj: Any) -> str | None:
        try:
            return cache[obj]
        except KeyError:
            cache[obj] = name = group_of(obj)
            return name
        except TypeError:  # not weakly referenceable: no cache
            return group_of(obj)

    return cached


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


def _not_compiling() -> bool:
    return False


def compiling_check() -> Callable[[], bool]:
    """torch.compiler.is_compiling of the torch this process imported (a constant to dynamo,
    so a wrapper branching on it traces only its compiled branch); without torch, False."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    return getattr(compiler, "is_compiling", _not_compiling)


# Set once torch._dynamo is imported (in a process that never compiles, registering the op
# now and then aborted the exit); a traced wrapper reads them at trace time.
_count_op: Any = None  # torch.ops.rankscope.census_count
_traced_group: Any = None  # _group_of_id, as torch.compiler.assume_constant_result
_group_ofs: list[GroupOf] = []  # a traced wrapper's group_of, by the slot it captures


def _group_of_id(slot: int, op: str, ident: int) -> str | None:
    """The group of the object dynamo is tracing, handed on as its id: dynamo passes an id
    on as a constant (and guards the graph to that object), where an object or the ints it
    holds may not be (before torch 2.13; an int that differs between traces turns symbolic).
    The object is alive: dynamo holds it while it traces."""
    obj = ctypes.cast(ident, ctypes.py_object).value
    try:
        return _group_ofs[slot](obj)
    except Exception as exc:
        _counts.failed("traced group name", exc, op)
        return None


def _register_count_op(_dynamo: Any = None) -> None:
    """Register the custom op a compiled graph counts through, marked side-effectful (or
    AOTAutograd drops it as an op with no output)."""
    global _count_op, _traced_group
    if _count_op is not None:
        return
    torch = sys.modules["torch"]
    try:

        def census_count(group: str, op: str) -> None:
            _counts.count(group, op)

        # custom_op reads the annotations; this module's are strings (future annotations)
        census_count.__annotations__ = {"group": str, "op": str, "return": None}
        defined = torch.library.custom_op("rankscope::census_count", census_count, mutates_args=())
        defined.register_fake(lambda group, op: None)
        torch.fx.node.has_side_effect(torch.ops.rankscope.census_count.default)
        _traced_group = torch.compiler.assume_constant_result(_group_of_id)
        _count_op = torch.ops.rankscope.census_count
    except Exception as exc:  # traced calls pass through uncounted; eager ones still count
        log.warning("rankscope census: no counting under torch.compile: %r", exc)


def _traced_counter(
    group_of: GroupOf, op: str | OpNamer, traced: bool
) -> Callable[[Any], None] | None:
    """What a wrapper does under tracing: emit the count op for ``self``'s group. None: pass
    through uncounted (a method whose compiled path reaches a counted method through the
    framework's opaque custom op, counted there; a p2p op, whose peer is an argument)."""
    if not traced or not isinstance(op, str) or compiling_check() is _not_compiling:
        return None
    if "torch._dynamo" in sys.modules:
        _register_count_op()
    else:
        after_import("torch._dynamo", _register_count_op)
    slot = len(_group_ofs)  # an int in the closure: a constant to dynamo
    _group_ofs.append(group_of)

    def count_traced(obj: Any) -> None:
        count_op, traced_group = _count_op, _traced_group
        if count_op is not None:
            group = traced_group(slot, op, id(obj))
            if group is not None:
                count_op(group, op)

    return count_traced


def _method_wrapper(
    original: Callable[..., Any],
    op: str | OpNamer,
    group_of: GroupOf,
    count_traced: Callable[[Any], None] | None,
) -> Callable[..., Any]:
    compiling = compiling_check()
    fixed, namer = (op, None) if isinstance(op, str) else (None, op)  # chosen once, here

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling():  # a constant to dynamo: the eager branch below is never traced
            if count_traced is not None:
                count_traced(self)
            return original(self, *args, **kwargs)
        if GUARD.depth:
            return original(self, *args, **kwargs)
        GUARD.depth, key = 1, None
        try:
            try:
                group = group_of(self)
                name = fixed if namer is None else namer(self, args, kwargs)
                if group is not None and name is not None:
                    key = (group, name)
                    _counts.count(group, name)
            except Exception as exc:  # a naming failure costs a count, never the call
                _counts.failed("count", exc, original, op)
            return original(self, *args, **kwargs)
        except BaseException:
            if key is not None:  # a call that raised did not happen: take it back
                _counts.count(*key, -1)
            raise
        finally:
            GUARD.depth = 0

    setattr(wrapper, MARK, True)
    return wrapper


def instrument_methods(
    cls: type,
    methods: Mapping[str, str | OpNamer] | Iterable[str],
    group_of: GroupOf = coordinator_group,
    *,
    eager_only: Collection[str] = (),
) -> Callable[[], None]:
    """Count each call of the named methods of ``cls``: ``methods`` maps a method name to its op
    name (or an op namer, for p2p), or lists names counted as themselves; ``group_of(self)``
    gives the group instance (None: not counted). ``eager_only`` methods, traced by torch.compile
    into the framework's opaque custom op that reaches another counted method, count nothing
    traced (else twice). A method missing or already wrapped is skipped with a log line."""
    table = dict(methods) if isinstance(methods, Mapping) else {m: m for m in methods}
    cached = _cached(group_of)
    undos: list[Callable[[], None]] = []
    for name, op in table.items():
        current = getattr(cls, name, None)
        if current is None or not callable(current):
            why = "is no method"
        elif getattr(current, MARK, False):
            why = "is counted already"
        elif isinstance(cls.__dict__.get(name), (staticmethod, classmethod)):
            why = "is not an instance method"
        else:
            traced = _traced_counter(cached, op, name not in eager_only)
            undos.append(patch(cls, name, _method_wrapper(current, op, cached, traced)))
            continue
        log.warning("rankscope census: %s.%s %s; not counted", cls.__name__, name, why)
    return undo_all(undos)
