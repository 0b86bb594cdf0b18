"""Arming a Python process with no code change: the entry point of ``rankscope-auto.pth``,
which calls :func:`arm` when RANKSCOPE_AUTO is set (``rankscope run`` sets it). Armed, a
process records the generic marks (docs/probe.md): process start and exit, then once the
program imports torch ``cuda_init``, ``nccl_init_*`` and ``capture_*``, with the census on
its automatic cadence, serving samples, the OOM observer and the adapters. Hooks never raise."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

# rankscope.record loads only once armed: RANKSCOPE_AUTO=0 imports this module alone
if TYPE_CHECKING:
    from rankscope.record import GroupFields, MarkFields, PoolFields

log = logging.getLogger("rankscope.auto")

ENV_AUTO = "RANKSCOPE_AUTO"
ENV_COMPARE = "RANKSCOPE_COMPARE"
# Census cadence under run: a snapshot every N collectives of the world group.
DEFAULT_AUTO_EVERY = 500
OFF = ("", "0", "false", "off", "no")

OPTIONAL_INSTALLS = (
    ("rankscope.rank.probe.oom", "install"),
    ("rankscope.rank.adapters", "install_import_hooks"),
)

_armed = False
_tried = False  # arm() made its one attempt
_cuda_marked = False
_internal = threading.local()  # set while rankscope creates its own process group


def enabled(environ: Any = None, name: str = ENV_AUTO) -> bool:
    env = os.environ if environ is None else environ
    return str(env.get(name, "")).strip().lower() not in OFF


def arm() -> bool:
    """Arm this process (idempotent). Never raises; True when armed."""
    global _armed, _tried
    # One attempt per process: a venv's site.py runs the .pth line twice (the venv's
    # site-packages is both its own prefix's and the site prefixes'), and a failed attempt
    # tried again would say its warning again.
    if _armed or _tried:
        return _armed
    try:
        if not enabled():
            return False
        _tried = True
        _armed = _arm()
    except Exception as exc:
        log.warning("rankscope: automatic instrumentation failed and is off: %r", exc)
    return _armed


def _arm() -> bool:
    from rankscope.rank.writer import ENV_DIR, RECORDER, publish_boot_id

    if not RECORDER.armed:
        log.warning("rankscope: %s is set without %s; nothing is recorded", ENV_AUTO, ENV_DIR)
        return False
    # Without the wrapper (a pod spec, Slurm), the first armed process fixes the boot id for
    # every process it starts, and records under it itself.
    RECORDER.configure(boot_id=publish_boot_id())
    _mark_process_start()
    atexit.register(_process_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forked)
    if "torch" in sys.modules:
        _on_torch(sys.modules["torch"])
    else:
        from rankscope.rank.imports import after_import

        after_import("torch", _on_torch)
    for module, attr in OPTIONAL_INSTALLS:
        _optional(module, attr)
    return True


def _optional(module: str, attr: str) -> None:
    try:
        getattr(importlib.import_module(module), attr)()
    except ImportError as exc:
        log.debug("rankscope: %s is not available here: %s", module, exc)
    except Exception as exc:
        log.warning("rankscope: %s.%s() failed: %r", module, attr, exc)


def _mark(phase: str, fields: dict[str, Any] | MarkFields | None = None) -> None:
    from rankscope.rank import probe

    probe.mark_fields(phase, {} if fields is None else fields)


def _mark_process_start() -> None:
    from rankscope.record import ProcessStartFields

    _mark("process_start", ProcessStartFields(sys.version.partition(" ")[0]))


def _process_exit() -> None:
    with contextlib.suppress(Exception):
        _mark("process_exit")


def _forked() -> None:
    # A fork (a forkserver's or a fork-method child) is a new process: its own file and
    # its own start mark, in the same boot.
    with contextlib.suppress(Exception):
        from rankscope.record import ProcessStartFields

        _mark("process_start", ProcessStartFields(forked=True))


# --- torch, hooked when the program imports it ----------------------------------------------


def _on_torch(torch: ModuleType) -> None:
    # Runs inside the program's `import torch`: nothing may escape into it.
    for hook in (_hook_census, _hook_cuda_init, _hook_process_groups, _hook_graphs, _samples):
        try:
            hook(torch)
        except Exception as exc:
            log.warning("rankscope: %s not installed: %r", hook.__name__.lstrip("_"), exc)


def _samples(torch: ModuleType) -> None:
    from rankscope.rank.probe import samples

    samples.start()


def _hook_census(torch: ModuleType) -> None:
    from rankscope.rank import census
    from rankscope.rank.census import counts, snapshots

    if not counts.ARMED:
        return  # rankscope run --no-census (RANKSCOPE_CENSUS=0)
    given = os.environ.get(snapshots.ENV_EVERY)
    census.configure(auto_every=snapshots.every_from_env() if given else DEFAULT_AUTO_EVERY)
    census.instrument_torch_distributed(on_world=snapshots.auto_tick)


def _hook_cuda_init(torch: ModuleType) -> None:
    # A queued call runs inside torch.cuda's lazy init, whatever triggered it.
    torch.cuda._lazy_call(_on_cuda_init)


def _on_cuda_init() -> None:
    # Runs inside torch.cuda._lazy_init, where an exception would fail the host's CUDA init.
    global _cuda_marked
    if _cuda_marked:
        return
    _cuda_marked = True
    with contextlib.suppress(Exception):
        _mark("cuda_init")


def _hook_process_groups(torch: ModuleType) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    for name, before, after in (
        ("init_process_group", _world_begin, _world_end),
        ("new_group", _group_begin, _group_end),
        ("destroy_process_group", _group_destroyed, None),
    ):
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "__rankscope_auto__", False):
            continue
        wrapper = _around(dist, original, before, after)
        wrapper.__rankscope_auto__ = True  # type: ignore[attr-defined]
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)


Call = tuple[tuple[Any, ...], dict[str, Any]]  # a call's positional and keyword arguments


def _around(
    dist: Any,
    original: Callable[..., Any],
    before: Callable[[Call], None],
    after: Callable[[Any, Call, Any, float], None] | None,
) -> Callable[..., Any]:
    """``original`` between guarded ``before(call)`` and ``after(dist, call, result, seconds)``."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_internal, "creating", False):
            return original(*args, **kwargs)
        call = (args, kwargs)
        _guarded(before, call)
        started = time.monotonic()
        result = original(*args, **kwargs)
        if after is not None:
            _guarded(after, dist, call, result, time.monotonic() - started)
        return result

    return wrapper


def _arg(call: Call, name: str, at: int) -> Any:
    args, kwargs = call
    return kwargs.get(name, args[at] if len(args) > at else None)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _group_fields(dist: Any, group: Any, seconds: float) -> GroupFields:
    """nccl_init_end's fields: seconds, the census's instance name, ranks, backend (null unread)."""
    from rankscope.rank.census.torch_patch import _instance_of
    from rankscope.record import GroupFields

    name = ranks = backend = None
    with contextlib.suppress(Exception):
        name = _instance_of(dist, group)
    with contextlib.suppress(Exception):
        pg = group if group is not None else dist.GroupMember.WORLD
        ranks = list(dist.get_process_group_ranks(pg))
    with contextlib.suppress(Exception):
        backend = str(dist.get_backend(group))
    return GroupFields(seconds, name, ranks, backend)


def _world_begin(call: Call) -> None:
    _mark("nccl_init_begin", {"group": "world", "backend": _text(_arg(call, "backend", 0))})


def _world_end(dist: Any, call: Call, result: Any, seconds: float) -> None:
    from rankscope.rank.writer import RECORDER

    if RECORDER.rank.rank is None:  # multiprocessing.spawn: no RANK in the environment
        RECORDER.configure(rank=dist.get_rank(), world_size=dist.get_world_size())
    _mark("nccl_init_end", _group_fields(dist, None, seconds))
    from rankscope.rank import census
    from rankscope.rank.census import counts

    if not counts.ARMED:
        return
    # Every rank dumps its local counts at exit or on SIGTERM, whatever the cadence reached.
    census.install_abort_handlers()
    # A hung rank is named from outside it: its counts are written on time, and its stall.
    census.start_watcher()
    if enabled(name=ENV_COMPARE):
        # new_group is a collective: every rank reaches this point right after the world
        # group, before any group of the program's own, so the order agrees on all ranks.
        _internal.creating = True
        try:
            census.enable_comparison()
        finally:
            _internal.creating = False


def _group_begin(call: Call) -> None:
    ranks = _plain_ranks(_arg(call, "ranks", 0))
    _mark("nccl_init_begin", {"ranks": ranks, "backend": _text(_arg(call, "backend", 2))})


def _plain_ranks(ranks: Any) -> list[int] | None:
    try:
        return None if ranks is None else sorted(int(r) for r in ranks)
    except (TypeError, ValueError):
        return None


def _group_end(dist: Any, call: Call, group: Any, seconds: float) -> None:
    if isinstance(group, dist.ProcessGroup):
        fields = _group_fields(dist, group, seconds)
    else:  # this rank is no member: torch returns a placeholder
        from rankscope.record import GroupFields

        ranks = _plain_ranks(_arg(call, "ranks", 0))
        fields = GroupFields(seconds, None, ranks, None, member=False)
    _mark("nccl_init_end", fields)


def _group_destroyed(call: Call) -> None:
    """Destroying the comparison's group under its thread: stop the thread first."""
    from rankscope.rank.census import gloo

    group, active = _arg(call, "group", 0), gloo._active
    if active is not None and (group is None or group is active.group):
        gloo.disable_comparison()


def _hook_graphs(torch: ModuleType) -> None:
    # The census's one instrumentation of CUDAGraph (it counts nothing when disarmed) carries
    # the capture marks too.
    from rankscope.rank.census import graphs

    graphs.instrument_cuda_graphs(
        on_begin=lambda graph: _guarded(_mark, "capture_begin"),
        on_end=lambda graph: _guarded(_mark_capture_end, torch, graph),
    )


def _mark_capture_end(torch: Any, graph: Any) -> None:
    _mark("capture_end", pool_fields(torch, graph))


def pool_fields(torch: Any, graph: Any) -> PoolFields:
    """The captured graph's memory pool and the bytes the allocator holds in it (null, with
    a why, where unreadable): the pool's, which graphs may share, not this graph's alone."""
    from rankscope.record import PoolFields

    try:
        pool_id = tuple(map(int, graph.pool()))
    except Exception as exc:
        return PoolFields(None, None, f"pool unreadable: {exc!r}")
    try:
        segments, why = pool_segments(torch, pool_id)
        held = pool_bytes(segments, pool_id)
        if held == 0 and why is None:  # the pool's own snapshot: check the whole allocator
            segments = _whole_snapshot(torch)
            held = pool_bytes(segments, pool_id)
            if held:
                why = f"the snapshot of pool {pool_id} listed none of its segments: {WHOLE}"
    except Exception as exc:
        return PoolFields(pool_id, None, f"no snapshot: {exc!r}")
    if held == 0:  # say which pools do hold segments: the capture may have used another
        pools = sorted({tuple(s.get("segment_pool_id", ())) for s in segments})
        why = f"no allocator segment in pool {pool_id} at capture end; pools holding some: {pools}"
    return PoolFields(pool_id, held, why)


WHOLE = "bytes summed from the whole allocator's snapshot (every segment of the process)"

# The argument forms torch._C._cuda_memorySnapshot takes for one memory pool, newest first,
# as what follows the pool id's two numbers: (pool, include_traces), then (pool). The first
# capture_end finds the one this torch takes; one pool's snapshot builds only its segments,
# where the whole allocator's builds every segment of the process (hundreds in serving).
POOL_SNAPSHOT_FORMS: tuple[tuple[Any, ...], ...] = ((False,), ())
_UNTRIED = "untried"
_pool_form: Any = _UNTRIED  # the form that worked, or None when none did


def pool_segments(
    torch: Any, pool_id: tuple[int, ...]
) -> tuple[Sequence[dict[str, Any]], str | None]:
    """(the segments holding pool ``pool_id``'s, why the read was the whole allocator's)."""
    global _pool_form
    form = _pool_form
    if type(form) is tuple:
        try:
            return torch._C._cuda_memorySnapshot(pool_id + form)["segments"], None
        except (AttributeError, TypeError, RuntimeError, KeyError) as exc:
            why = f"the snapshot of pool {pool_id} failed ({exc!r}): {WHOLE}"
            return _whole_snapshot(torch), why
    if form is _UNTRIED:
        if len(pool_id) != 2:  # not torch's (a, b): no form to learn from this one
            return _whole_snapshot(torch), f"pool id {pool_id} is not two numbers: {WHOLE}"
        for form in POOL_SNAPSHOT_FORMS:
            try:
                segments = torch._C._cuda_memorySnapshot(pool_id + form)["segments"]
            except (AttributeError, TypeError, RuntimeError, KeyError):
                continue
            _pool_form = form
            return segments, None
        _pool_form = None
    return _whole_snapshot(torch), f"this torch takes no snapshot of one pool: {WHOLE}"


def _whole_snapshot(torch: Any) -> list[dict[str, Any]]:
    return list(torch.cuda.memory._snapshot().get("segments", []))


def pool_bytes(segments: Sequence[dict[str, Any]], pool_id: Sequence[int]) -> int:
    """Bytes of the allocator snapshot's segments in memory pool ``pool_id``."""
    want = tuple(pool_id)
    return sum(
        int(seg.get("total_size", 0))
        for seg in segments
        if tuple(seg.get("segment_pool_id", ())) == want
    )


def _guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        log.warning("rankscope: %s failed: %r", getattr(fn, "__name__", fn), exc)
