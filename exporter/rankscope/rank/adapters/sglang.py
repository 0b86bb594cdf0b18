"""The SGLang adapter: marks on ``ModelRunner`` (target and draft runners) and ``Scheduler``,
ranks from parallel_state, the KV pool as arena ``kv`` (``kv_draft``), the census at
``GroupCoordinator``, a tick per scheduler iteration; docs/integrations.md has each."""

from __future__ import annotations

import weakref
from typing import Any

from rankscope.rank import census, probe
from rankscope.rank.adapters import common
from rankscope.rank.adapters.points import Adapter, HookPoint, Installer, Wrap

PARALLEL_STATE = "sglang.srt.distributed.parallel_state"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
SCHEDULER = "sglang.srt.managers.scheduler"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
SWA_POOL = "sglang.srt.mem_cache.swa_memory_pool"
UNIFIED_POOL = "sglang.srt.mem_cache.unified_memory_pool"

# GroupCoordinator method -> census op. The private methods are what SGLang's custom ops
# call, so a torch.compile'd model that never enters the public method is still counted.
COORDINATOR_OPS: dict[str, common.Op] = {
    "all_reduce": "all_reduce",
    "_all_reduce_in_place": "all_reduce",
    "_all_reduce_out_place": "all_reduce",
    "_flashinfer_allreduce": "all_reduce",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "_all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "_reduce_scatter_tensor": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single",
    "_all_to_all_single": "all_to_all_single",
    "reduce_scatter": "reduce_scatter",
    "all_gatherv": "all_gatherv",
    "reduce_scatterv": "reduce_scatterv",
    "broadcast": "broadcast",
    "broadcast_object": "broadcast_object",
    "broadcast_object_list": "broadcast_object",
    "broadcast_tensor_dict": "broadcast_tensor_dict",
    "all_gather_object": "all_gather_object",
    "gather": "gather",
    "barrier": "barrier",
    "send": ("send", "dst", 1),
    "recv": ("recv", "src", 2),
    "send_object": ("send", "dst", 1),
    "recv_object": ("recv", "src", 0),
    "send_tensor_dict": ("send", "dst", 1),
    "recv_tensor_dict": ("recv", "src", 0),
}
# Traced by torch.compile, these reach SGLang's opaque custom ops (inplace_all_reduce,
# outplace_all_reduce, flashinfer_allreduce, reg_*), whose private methods count each call
# when the graph runs: the public method counting too would count it twice.
EAGER_ONLY = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_gather",
)


def _runner(model_runner: Any) -> str:
    return "draft" if getattr(model_runner, "is_draft_worker", False) else "target"


def _configure_ranks(model_runner: Any, args: Any, kwargs: Any) -> None:
    role = None if _runner(model_runner) == "draft" else "target"
    common.configure_ranks(PARALLEL_STATE, runner=role)


def _pool_sized(model_runner: Any, args: Any, kwargs: Any) -> None:
    role = _runner(model_runner)
    pool = model_runner.token_to_kv_pool
    if pool is not None:
        arena = KvPoolArena(pool, draft=role == "draft")
        common.register_arena("kv" if role == "target" else "kv_draft", arena)
    probe.mark("kv_pool_sized", runner=role)


MODEL_RUNNER_HOOKS: dict[str, Wrap] = {
    "init_torch_distributed": Wrap(after=_configure_ranks),
    "load_model": common.marks("pre_weight_load", "weights_loaded", _runner),
    "alloc_memory_pool": Wrap(after=_pool_sized),
    "init_cuda_graphs": common.marks("capture_begin", "capture_end", _runner),
}
SCHEDULER_HOOKS: dict[str, Wrap] = {
    "ingest_requests": Wrap(before=lambda *_: census.tick()),
    "run_batch": Wrap(after=lambda *_: common.first_forward(ADAPTER)),
}

POINTS: tuple[HookPoint, ...] = (
    *common.coordinator_points(PARALLEL_STATE, COORDINATOR_OPS),
    *common.wrap_points(MODEL_RUNNER, "ModelRunner", MODEL_RUNNER_HOOKS),
    HookPoint(MODEL_RUNNER, "ModelRunner.is_draft_worker", "read"),
    HookPoint(MODEL_RUNNER, "ModelRunner.token_to_kv_pool", "read"),
    *common.wrap_points(SCHEDULER, "Scheduler", SCHEDULER_HOOKS),
    *(
        HookPoint(MEMORY_POOL, f"{cls}.get_kv_size_bytes", "read")
        for cls in ("MHATokenToKVPool", "MLATokenToKVPool", "HybridLinearKVPool")
    ),
    HookPoint(MEMORY_POOL, "KVCache.post_capture_active", "read"),
    HookPoint(MEMORY_POOL, "HybridLinearKVPool.post_capture_active", "read"),
    HookPoint(MEMORY_POOL, "MHATokenToKVPool.post_capture_backed_bytes", "read"),
    HookPoint(MEMORY_POOL, "HybridLinearKVPool.post_capture_backed_bytes", "read"),
    HookPoint(MEMORY_POOL, "HybridLinearKVPool.full_kv_pool", "read"),
    HookPoint(SWA_POOL, "SWAKVPool.get_kv_size_bytes", "read"),
    HookPoint(SWA_POOL, "SWAKVPool.post_capture_active", "read"),
    HookPoint(SWA_POOL, "SWAKVPool.post_capture_backed_bytes", "read"),
    HookPoint(UNIFIED_POOL, "UnifiedKVPool.total_bytes", "read"),
    HookPoint(UNIFIED_POOL, "UnifiedKVPool.post_capture_active", "read"),
    HookPoint(UNIFIED_POOL, "UnifiedKVPool.post_capture_backed_bytes", "read"),
    HookPoint(UNIFIED_POOL, "UnifiedMHATokenToKVPool._unified_buffer", "read"),
    HookPoint(UNIFIED_POOL, "UnifiedMLATokenToKVPool._unified_buffer", "read"),
    HookPoint(UNIFIED_POOL, "UnifiedSWAKVPool.unified_buffer", "read"),
)


def unified_buffer(pool: Any) -> Any:
    """The one byte buffer all KV sub-pools share under --enable-unified-memory (SGLang's
    UnifiedKVPool), found on the pool or on the full-attention pool it wraps; None without."""
    for holder in (pool, getattr(pool, "full_kv_pool", None)):
        for attr in ("_unified_buffer", "unified_buffer"):
            buffer = getattr(holder, attr, None)
            if buffer is not None:
                return buffer
    return None


class KvPoolArena:
    """SGLang's KV pool in the arena protocol, held weakly; docs/integrations.md says what
    each figure is, for each pool class and mode."""

    retained_bytes = None  # unknown: the framework reports no parked handles

    def __init__(self, pool: Any, *, draft: bool = False) -> None:
        self._pool = weakref.ref(pool)
        self._draft = draft

    def _live(self) -> Any:
        pool = self._pool()
        if pool is None:
            raise LookupError("the KV pool was freed")
        return pool

    def reserved_bytes(self) -> int:
        pool = self._live()
        shared = unified_buffer(pool)
        if shared is not None:
            return 0 if self._draft else int(shared.total_bytes)
        size_of = getattr(pool, "get_kv_size_bytes", None)
        if size_of is None:
            raise LookupError(f"SGLang's {type(pool).__name__} does not report its size")
        size = size_of()
        return int(sum(size)) if isinstance(size, tuple) else int(size)

    def backed_bytes(self) -> int:
        pool = self._live()
        vmm = unified_buffer(pool) or pool
        if getattr(vmm, "post_capture_active", False):
            if self._draft and vmm is not pool:
                return 0
            return int(vmm.post_capture_backed_bytes)
        return self.reserved_bytes()


class SGLangAdapter(Adapter):
    framework = "sglang"
    distribution = "sglang"
    checked_versions = ("0.5.22", "0.5.23")
    points = POINTS

    def installers(self) -> dict[str, Installer]:
        return {
            PARALLEL_STATE: common.counting(self, COORDINATOR_OPS, EAGER_ONLY),
            MODEL_RUNNER: common.wrapping(self, MODEL_RUNNER_HOOKS),
            SCHEDULER: common.wrapping(self, SCHEDULER_HOOKS),
        }


ADAPTER: Adapter = SGLangAdapter()
