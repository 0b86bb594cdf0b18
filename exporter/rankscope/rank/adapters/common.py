"""What the SGLang and vLLM adapters do alike: count a GroupCoordinator-shaped class, read
ranks from the framework's parallel_state, mark the end of the boot, hold KV arena views."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from types import ModuleType
from typing import Any

from rankscope.rank import census, probe
from rankscope.rank.adapters.points import (
    Adapter,
    AttachError,
    HookPoint,
    Installer,
    Undo,
    Wrap,
    points_of,
    resolve,
    wrap_method,
)


def group_of(coordinator: Any) -> str | None:
    """The group instance of a coordinator or device communicator; None (not counted) for a
    group of one rank, where the framework returns before any collective."""
    if getattr(coordinator, "world_size", 2) == 1:  # one without world_size is counted
        return None
    return census.coordinator_group(coordinator)


def count_methods(
    module: Any, points: list[HookPoint], table: Mapping[str, Op], eager_only: Collection[str] = ()
) -> list[Undo]:
    """Count the methods of ``points`` (all of one class) under the ops of ``table``;
    ``eager_only`` as census.instrument_methods takes it."""
    if not points:
        return []
    owners = {resolve(module, p)[0] for p in points}
    if len(owners) != 1:
        raise AttachError(points[0].name, "count points span more than one class")
    ops = {m: table[m] for m in (p.qualname.rsplit(".", 1)[1] for p in points)}
    methods = {
        m: op if isinstance(op, str) else census.coordinator_p2p(*op) for m, op in ops.items()
    }
    cls = owners.pop()
    return [census.instrument_methods(cls, methods, group_of=group_of, eager_only=eager_only)]


# A counted method's op: a collective's name, or a p2p op's (send or recv, the peer's
# parameter, its position after self)
Op = str | tuple[str, str, int]


def count_points(module: str, cls: str, ops: Mapping[str, Op]) -> tuple[HookPoint, ...]:
    """The count points of ``cls``'s methods, with the peer parameter a p2p op reads."""
    return tuple(
        HookPoint(module, f"{cls}.{m}", "count", () if isinstance(op, str) else (op[1:],))
        for m, op in ops.items()
    )


def coordinator_points(parallel_state: str, ops: Mapping[str, Op]) -> tuple[HookPoint, ...]:
    """The hook points both frameworks' GroupCoordinator offers alike: its counted ops, the
    attributes that name its group and ranks, and the module's group getters."""
    return (
        *count_points(parallel_state, "GroupCoordinator", ops),
        *(
            HookPoint(parallel_state, f"GroupCoordinator.{a}", "read")
            for a in ("unique_name", "ranks", "rank_in_group", "world_size", "rank", "local_rank")
        ),
        *(
            HookPoint(parallel_state, f, "call")
            for f in ("get_world_group", "get_tp_group", "get_pp_group")
        ),
    )


def counting(
    adapter: Adapter, table: Mapping[str, Op], eager_only: Collection[str] = ()
) -> Installer:
    """The installer of a module whose count points are on one class: resolve the functions the
    adapter calls there (a missing one fails the attach, not the boot), then count the methods."""

    def install(module: ModuleType) -> list[Undo]:
        for point in points_of(adapter, module.__name__, ("call",)):
            resolve(module, point)
        counted = points_of(adapter, module.__name__, ("count",))
        return count_methods(module, counted, table, eager_only)

    return install


def wrap_points(module: str, cls: str, hooks: Mapping[str, Wrap]) -> tuple[HookPoint, ...]:
    """The wrap points of ``cls``'s methods, with the parameters their hooks read."""
    return tuple(HookPoint(module, f"{cls}.{m}", "wrap", w.params) for m, w in hooks.items())


def wrapping(adapter: Adapter, hooks: Mapping[str, Wrap]) -> Installer:
    """The installer of a module whose wrap points are on one class: wrap its methods."""

    def install(module: ModuleType) -> list[Undo]:
        points = points_of(adapter, module.__name__, ("wrap",))
        cls = {resolve(module, p)[0] for p in points}.pop()
        return [wrap_method(cls, m, w) for m, w in hooks.items()]

    return install


def marks(before: str, after: str, runner: Callable[[Any], str]) -> Wrap:
    """Marking phase ``before`` and ``after`` a call, for ``runner(self)``."""
    return Wrap(
        lambda obj, args, kwargs: probe.mark(before, runner=runner(obj)),
        lambda obj, args, kwargs: probe.mark(after, runner=runner(obj)),
    )


def configure_ranks(parallel_state: str, *, runner: str | None) -> None:
    """rank, local_rank, world_size from the world group; tp_rank, pp_rank from the TP and PP
    groups: the framework's own state (its ranks start without RANK in the environment)."""
    ps = sys.modules[parallel_state]
    world, tp, pp = ps.get_world_group(), ps.get_tp_group(), ps.get_pp_group()
    probe.configure(
        rank=int(world.rank),
        local_rank=int(world.local_rank),
        world_size=int(world.world_size),
        tp_rank=int(tp.rank_in_group),
        pp_rank=int(pp.rank_in_group),
        runner=runner,
    )


def first_forward(adapter: Adapter) -> None:
    """``first_forward`` and ``boot_complete``, once per process, when the first step returns."""
    if not adapter.booted:
        adapter.booted = True
        probe.mark("first_forward", runner="target")
        probe.mark("boot_complete", runner="target")


# KV arena views, held here: the registry holds views weakly, each view its pool weakly.
ARENA_VIEWS: dict[str, Any] = {}


def register_arena(name: str, view: Any) -> None:
    ARENA_VIEWS[name] = view
    probe.arenas.register(name, view)
