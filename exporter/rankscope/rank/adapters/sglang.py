"""The SGLang adapter: attaches when SGLang's own modules are imported (never imported here).

- Marks, on ``ModelRunner`` (target and speculative draft runners alike, ``runner`` from its
  ``is_draft_worker``): ``pre_weight_load`` / ``weights_loaded`` around ``load_model``,
  ``kv_pool_sized`` after ``alloc_memory_pool``, ``capture_begin`` / ``capture_end`` around
  ``init_cuda_graphs``; on ``Scheduler``: ``first_forward`` and ``boot_complete`` when the
  first ``run_batch`` returns.
- Ranks: after ``ModelRunner.init_torch_distributed``, from parallel_state's world, TP and PP
  groups.
- KV arena ``kv`` (``kv_draft`` for the draft runner): the runner's ``token_to_kv_pool``;
  reserved = ``get_kv_size_bytes()`` (K + V; the VA upper bound of a post-capture VMM pool),
  backed = its VMM owner's ``backed_bytes`` where it has one, else reserved (plain tensors
  are committed when allocated), retained = unknown (SGLang parks no handles it reports).
- Census: ``GroupCoordinator``'s public collectives and the private methods its custom ops
  reach (custom all-reduce, pynccl, symmetric memory, mscclpp and torch.distributed all sit
  below them), keyed by group instance; one count per call however many layers it crosses.
- Ticks: once per scheduler loop iteration, at ``Scheduler.ingest_requests``, which every
  event loop (normal, overlap, PP, disaggregation) calls once per iteration on every rank.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

from rankscope.rank import census, probe
from rankscope.rank.adapters import common
from rankscope.rank.adapters.points import (
    Adapter,
    HookPoint,
    Installer,
    Undo,
    points_of,
    resolve,
    wrap_method,
)

PARALLEL_STATE = "sglang.srt.distributed.parallel_state"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
SCHEDULER = "sglang.srt.managers.scheduler"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
VMM_BACKING = "sglang.srt.mem_cache.kv_vmm_backing"

# GroupCoordinator method -> census op. The private methods are what SGLang's custom ops
# (inplace_all_reduce, reg_all_gather_into_tensor, ...) call, so a torch.compile'd model
# that never enters the public method is still counted.
COORDINATOR_OPS: dict[str, Any] = {
    "all_reduce": "all_reduce",
    "_all_reduce_in_place": "all_reduce",
    "_all_reduce_out_place": "all_reduce",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "_all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "_reduce_scatter_tensor": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single",
    "_all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "gather": "gather",
    "barrier": "barrier",
    "send": census.coordinator_p2p("send", "dst", 1),
    "recv": census.coordinator_p2p("recv", "src", 2),
    "send_object": census.coordinator_p2p("send", "dst", 1),
    "recv_object": census.coordinator_p2p("recv", "src", 0),
}
P2P_PARAMS = {
    "send": ("dst", 1),
    "recv": ("src", 2),
    "send_object": ("dst", 1),
    "recv_object": ("src", 0),
}

POINTS: tuple[HookPoint, ...] = (
    *common.coordinator_points(PARALLEL_STATE, COORDINATOR_OPS, P2P_PARAMS),
    HookPoint(MODEL_RUNNER, "ModelRunner.init_torch_distributed", "wrap"),
    HookPoint(MODEL_RUNNER, "ModelRunner.load_model", "wrap"),
    HookPoint(MODEL_RUNNER, "ModelRunner.alloc_memory_pool", "wrap"),
    HookPoint(MODEL_RUNNER, "ModelRunner.init_cuda_graphs", "wrap"),
    HookPoint(MODEL_RUNNER, "ModelRunner.is_draft_worker", "read"),
    HookPoint(MODEL_RUNNER, "ModelRunner.token_to_kv_pool", "read"),
    HookPoint(SCHEDULER, "Scheduler.ingest_requests", "wrap"),
    HookPoint(SCHEDULER, "Scheduler.run_batch", "wrap"),
    HookPoint(MEMORY_POOL, "MHATokenToKVPool.get_kv_size_bytes", "read"),
    HookPoint(MEMORY_POOL, "MLATokenToKVPool.get_kv_size_bytes", "read"),
    HookPoint(MEMORY_POOL, "MHATokenToKVPool._post_capture_owner", "read"),
    HookPoint(VMM_BACKING, "KvVmmBufferOwner.backed_bytes", "read"),
)


class KvPoolArena:
    """SGLang's KV pool in the arena protocol (rankscope.rank.probe.arenas), read from the pool's
    own accounting. Holds the pool weakly."""

    def __init__(self, pool: Any) -> None:
        self._pool = weakref.ref(pool)

    def _live(self) -> Any:
        pool = self._pool()
        if pool is None:
            raise LookupError("the KV pool was freed")
        return pool

    def reserved_bytes(self) -> int:
        size = self._live().get_kv_size_bytes()
        return int(sum(size)) if isinstance(size, tuple) else int(size)

    def backed_bytes(self) -> int:
        owner = getattr(self._live(), "_post_capture_owner", None)
        if owner is not None:
            return int(owner.backed_bytes)
        return self.reserved_bytes()

    def retained_bytes(self) -> None:
        return None


def _runner(model_runner: Any) -> str:
    return "draft" if getattr(model_runner, "is_draft_worker", False) else "target"


class SGLangAdapter(Adapter):
    framework = "sglang"
    distribution = "sglang"
    checked_versions = ("0.5.22", "0.5.23")
    points = POINTS

    def __init__(self) -> None:
        super().__init__()
        self.once = common.Once()

    def installers(self) -> dict[str, Installer]:
        return {
            PARALLEL_STATE: self._install_parallel_state,
            MODEL_RUNNER: self._install_model_runner,
            SCHEDULER: self._install_scheduler,
        }

    def _install_parallel_state(self, module: ModuleType) -> list[Undo]:
        return common.install_parallel_state(self, module, PARALLEL_STATE, COORDINATOR_OPS)

    def _install_model_runner(self, module: ModuleType) -> list[Undo]:
        wraps = points_of(self, MODEL_RUNNER, ("wrap",))
        cls = {resolve(module, p)[0] for p in wraps}.pop()

        def ranks(runner: Any, args: Any, kwargs: Any) -> None:
            common.configure_ranks(
                PARALLEL_STATE, runner=None if _runner(runner) == "draft" else "target"
            )

        def mark(phase: str) -> Any:
            return lambda runner, args, kwargs: probe.mark(phase, runner=_runner(runner))

        def pool_sized(runner: Any, args: Any, kwargs: Any) -> None:
            role = _runner(runner)
            pool = runner.token_to_kv_pool
            if pool is not None:
                common.register_arena("kv" if role == "target" else "kv_draft", KvPoolArena(pool))
            probe.mark("kv_pool_sized", runner=role)

        return [
            wrap_method(cls, "init_torch_distributed", after=ranks),
            wrap_method(
                cls, "load_model", before=mark("pre_weight_load"), after=mark("weights_loaded")
            ),
            wrap_method(cls, "alloc_memory_pool", after=pool_sized),
            wrap_method(
                cls, "init_cuda_graphs", before=mark("capture_begin"), after=mark("capture_end")
            ),
        ]

    def _install_scheduler(self, module: ModuleType) -> list[Undo]:
        wraps = points_of(self, SCHEDULER, ("wrap",))
        cls = {resolve(module, p)[0] for p in wraps}.pop()

        def tick(scheduler: Any, args: Any, kwargs: Any) -> None:
            census.tick()

        def first_batch(scheduler: Any, args: Any, kwargs: Any) -> None:
            if self.once.first("first_forward"):
                probe.mark("first_forward", runner="target")
                probe.mark("boot_complete", runner="target")

        return [
            wrap_method(cls, "ingest_requests", before=tick),
            wrap_method(cls, "run_batch", after=first_batch),
        ]


ADAPTER = SGLangAdapter()
