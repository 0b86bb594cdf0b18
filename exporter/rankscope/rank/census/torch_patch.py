"""Opt-in counting of torch.distributed collectives and p2p ops, once however they nest, under
the group's instance name (given with :func:`name_group`, else its ``group_desc``, else its pg
name, over its ranks)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any

from rankscope.rank.census import counts as _counts
from rankscope.rank.census.wrap import GUARD, MARK, compiling_check, patch, undo_all
from rankscope.rank.writer import RECORDER
from rankscope.record.naming import RECV, SEND, group_instance, p2p_name

log = logging.getLogger("rankscope.census")

COLLECTIVES = (
    *("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single"),
    *("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"),
    *("broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier"),
)
P2P = {"send": SEND, "isend": SEND, "recv": RECV, "irecv": RECV}
BATCH = "batch_isend_irecv"
# Functions whose torch implementation calls another listed here hold the guard, so the
# inner call is not counted again (the ops test counts each op exactly once).
NESTING = frozenset(
    {
        "send",  # torch's send is isend(...).wait()
        "recv",
        "all_gather_into_tensor",
        "all_gather_single",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        BATCH,
    }
)

_lock = threading.Lock()
_undo: Callable[[], None] | None = None

# id(process group) -> group instance name ('' for a group this rank is no member of);
# entries leave with their group.
_names: dict[int, str] = {}
_given: dict[int, str] = {}


def name_group(group: Any, name: str) -> None:
    """Name a process group for the census (``tp``, ``pp``...); its ranks are appended."""
    _given[id(group)] = name
    _names.pop(id(group), None)
    with contextlib.suppress(TypeError):
        weakref.finalize(group, _forget, id(group))


def _forget(key: int) -> None:
    _names.pop(key, None)
    _given.pop(key, None)


def _instance_of(dist: Any, group: Any) -> str | None:
    """``group``'s instance name (None: the default group's); None when this rank is no member."""
    if group is None:
        group = dist.GroupMember.WORLD
        if group is None:
            return None
    name = _names.get(id(group))
    return (_resolve(dist, group) if name is None else name) or None


def _resolve(dist: Any, group: Any) -> str:
    """Name ``group`` and cache it for its lifetime ('' when this rank is no member)."""
    ranks = None
    if isinstance(group, dist.ProcessGroup):  # not GroupMember.NON_GROUP_MEMBER (an int)
        with contextlib.suppress(Exception):  # not a member
            ranks = dist.get_process_group_ranks(group)
    name = ""
    if ranks is not None:
        base = _given.get(id(group))
        if base is None and group is dist.GroupMember.WORLD:
            base = "world"
        elif base is None:
            desc = getattr(group, "group_desc", None)
            base = desc if desc and desc != "undefined" else f"pg{group.group_name}"
        name = group_instance(base, ranks)
    with contextlib.suppress(TypeError):  # no weak reference: not cached under a reusable id
        weakref.finalize(group, _forget, id(group))
        _names[id(group)] = name
    return name


def _peer(dist: Any, group: Any, peer: Any, group_peer: Any) -> int | None:
    if peer is None and group_peer is not None:
        pg = group if group is not None else dist.GroupMember.WORLD
        peer = dist.get_global_rank(pg, group_peer)
    return None if peer is None else int(peer)


def _position(fn: Callable[..., Any], param: str) -> int | None:
    params = list(inspect.signature(fn).parameters)
    return params.index(param) if param in params else None


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, at: int | None) -> Any:
    value = kwargs.get(name) if kwargs else None
    if value is None and at is not None and len(args) > at:
        value = args[at]
    return value


def _counting(
    name: str,
    original: Callable[..., Any],
    count: Callable[[tuple[Any, ...], dict[str, Any]], None],
) -> Callable[..., Any]:
    """Count the call unless an outer counted call holds the guard (a failure is counted, the
    call still made), then make it, holding the guard for the functions that nest."""
    nests = name in NESTING
    compiling = compiling_check()

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Traced, the call becomes one of torch's functional collectives: not counted, and
        # the guard (a thread-local dynamo would guard on) untouched.
        if compiling() or GUARD.depth:
            return original(*args, **kwargs)
        try:
            count(args, kwargs)
        except Exception as exc:
            _counts.failed("count", exc, name)
        if not nests:
            return original(*args, **kwargs)
        GUARD.depth = 1
        try:
            return original(*args, **kwargs)
        finally:
            GUARD.depth = 0

    setattr(wrapper, MARK, True)
    return wrapper


def _collective_wrapper(
    dist: Any, name: str, original: Callable[..., Any], on_world: Callable[[], None] | None
) -> Callable[..., Any]:
    """``on_world`` (the automatic cadence) runs after each call on the default group."""
    group_at = _position(original, "group")
    world, table, names, counts = dist.distributed_c10d._world, _counts.COUNTS, _names, _counts
    # the field itself where this torch has it: the property is a Python call
    default_of = operator.attrgetter(
        "_default_pg" if hasattr(world, "_default_pg") else "default_pg"
    )

    def count(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        group = kwargs.get("group") if kwargs else None
        if group is None and group_at is not None and len(args) > group_at:
            group = args[group_at]
        default = default_of(world)
        if group is None:
            group = default
        instance = names.get(id(group)) or _instance_of(dist, group)
        if instance:
            key = (instance, name)
            table[key] += 1
            counts.last_key = key  # the collective a blocked rank is in, for the watcher
        if on_world is not None and group is default:
            on_world()

    return _counting(name, original, count)


def _p2p_wrapper(dist: Any, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    kind = P2P[name]
    peer_param = "dst" if kind == SEND else "src"
    group_at, peer_at = _position(original, "group"), _position(original, peer_param)

    def count(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        group = _arg(args, kwargs, "group", group_at)
        instance = _instance_of(dist, group)
        if instance is not None:
            peer = _arg(args, kwargs, peer_param, peer_at)
            group_peer = kwargs.get("group_" + peer_param)
            _counts.count(instance, p2p_name(kind, _peer(dist, group, peer, group_peer)))

    return _counting(name, original, count)


def _batch_wrapper(
    dist: Any, c10d: Any, original: Callable[..., Any], plain: dict[str, Any]
) -> Callable[..., Any]:
    """Count each p2p op once. torch matches ``op.op`` against its module's isend/irecv by
    identity: ops built before the patch get the current function for the call."""
    compiling = compiling_check()

    @functools.wraps(original)
    def wrapper(p2p_op_list: list[Any], *args: Any, **kwargs: Any) -> Any:
        if compiling() or GUARD.depth:
            return original(p2p_op_list, *args, **kwargs)
        GUARD.depth = 1
        swapped: list[tuple[Any, Any]] = []
        try:
            try:
                for p2p in p2p_op_list:
                    func = getattr(p2p.op, "__wrapped__", p2p.op)
                    kind, fname = (SEND, "isend") if func is plain["isend"] else (RECV, "irecv")
                    instance = _instance_of(dist, p2p.group)
                    if instance is not None:
                        peer = _peer(dist, p2p.group, p2p.peer, getattr(p2p, "group_peer", None))
                        _counts.count(instance, p2p_name(kind, peer))
                    current = getattr(c10d, fname)
                    if func is plain[fname] and p2p.op is not current:
                        swapped.append((p2p, p2p.op))
                        p2p.op = current
            except Exception as exc:
                _counts.failed("count", exc, BATCH)
            return original(p2p_op_list, *args, **kwargs)
        finally:
            for p2p, op in swapped:
                p2p.op = op
            GUARD.depth = 0

    setattr(wrapper, MARK, True)
    return wrapper


def instrument_torch_distributed(on_world: Callable[[], None] | None = None) -> Callable[[], None]:
    """Count every call of torch.distributed's collectives and p2p ops; idempotent, returns the
    undo (nothing patched, with a log line, without torch or disarmed). ``on_world`` (``rankscope
    run``'s ``census.auto_tick``) runs after each collective of the default group."""
    global _undo
    with _lock:
        if _undo is not None:
            return _undo
        if not _counts.ARMED:
            log.info(
                "rankscope census: disarmed (RANKSCOPE_CENSUS=0); torch.distributed is not patched"
            )
            return lambda: None
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d as c10d
        except ImportError as exc:
            log.warning("rankscope census: torch.distributed unavailable (%s); not patched", exc)
            return lambda: None
        if dist.is_initialized() and RECORDER.rank.rank is None:
            # Snapshots are compared by rank: take it from torch when the launcher set none.
            RECORDER.configure(rank=dist.get_rank(), world_size=dist.get_world_size())
        plain = {n: getattr(c10d, n) for n in (*COLLECTIVES, *P2P, BATCH) if hasattr(c10d, n)}
        wrappers = {
            n: _batch_wrapper(dist, c10d, f, plain)
            if n == BATCH
            else _p2p_wrapper(dist, n, f)
            if n in P2P
            else _collective_wrapper(dist, n, f, on_world)
            for n, f in plain.items()
        }
        restore = undo_all([patch(m, n, w) for n, w in wrappers.items() for m in (c10d, dist)])

        def undo() -> None:
            global _undo
            with _lock:
                restore()
                _undo = None

        _undo = undo
        return undo


def uninstrument_torch_distributed() -> None:
    """Undo :func:`instrument_torch_distributed` (no-op when not instrumented)."""
    undo = _undo
    if undo is not None:
        undo()
