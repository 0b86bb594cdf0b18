"""The vLLM adapter, V1 engine: marks on the GPU ``Worker`` (all the ``target`` runner's: a
drafter runs inside the same model runner), ranks from parallel_state, the KV cache as arena
``kv``, the census at ``GroupCoordinator`` and at the device communicator for calls that
bypass it, a tick per engine step; docs/integrations.md has each."""

from __future__ import annotations

import weakref
from typing import Any

from rankscope.rank import census, probe
from rankscope.rank.adapters import common
from rankscope.rank.adapters.points import Adapter, HookPoint, Installer, Wrap

PARALLEL_STATE = "vllm.distributed.parallel_state"
GPU_WORKER = "vllm.v1.worker.gpu_worker"
CUDA_COMMUNICATOR = "vllm.distributed.device_communicators.cuda_communicator"
BASE_COMMUNICATOR = "vllm.distributed.device_communicators.base_device_communicator"
KV_CACHE_INTERFACE = "vllm.v1.kv_cache_interface"
EXTENSIBLE_KV = "vllm.v1.worker.extensible_kv_cache"

# GroupCoordinator method -> census op. The private *_out_place methods are what both the
# eager path and the custom ops' implementations call.
COORDINATOR_OPS: dict[str, common.Op] = {
    "_all_reduce_out_place": "all_reduce",
    "_all_gather_out_place": "all_gather",
    "_reduce_scatter_out_place": "reduce_scatter",
    "all_gatherv": "all_gatherv",
    "reduce_scatterv": "reduce_scatterv",
    "reduce_scatterv_into_output": "reduce_scatterv",
    "gather": "gather",
    "broadcast": "broadcast",
    "broadcast_object": "broadcast_object",
    "broadcast_object_list": "broadcast_object",
    "broadcast_tensor_dict": "broadcast_tensor_dict",
    "barrier": "barrier",
    "cpu_all_reduce_": "cpu_all_reduce",
    "dispatch_router_logits": "dispatch",
    "dispatch": "dispatch",
    "combine": "combine",
    "combine_into_output": "combine",
    "send": ("send", "dst", 1),
    "recv": ("recv", "src", 2),
    "send_object": ("send", "dst", 1),
    "isend_object": ("send", "dst", 1),
    "recv_object": ("recv", "src", 0),
    "send_tensor_dict": ("send", "dst", 1),
    "isend_tensor_dict": ("send", "dst", 1),
    "recv_tensor_dict": ("recv", "src", 0),
    "irecv_tensor_dict": ("recv", "src", 0),
}
# CudaCommunicator method -> census op: the coordinator's names, so a call counted at either
# layer lands on the same (group, op).
COMMUNICATOR_OPS: dict[str, common.Op] = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "all_gatherv": "all_gatherv",
    "reduce_scatterv": "reduce_scatterv",
    "broadcast": "broadcast",
    "send": ("send", "dst", 1),
    "recv": ("recv", "src", 2),
}


def _target(worker: Any) -> str:
    return "target"  # a drafter runs inside the target's model runner


def _configure_ranks(worker: Any, args: Any, kwargs: Any) -> None:
    common.configure_ranks(PARALLEL_STATE, runner="target")


def _pool_sized(worker: Any, args: Any, kwargs: Any) -> None:
    config = kwargs.get("kv_cache_config", args[0] if args else None)
    if config is not None:
        arena = KvCacheArena(device_kv_bytes(config), getattr(worker, "model_runner", None))
        common.register_arena("kv", arena)
    probe.mark("kv_pool_sized", runner="target")


def _step_done(worker: Any, args: Any, kwargs: Any) -> None:
    census.tick()
    common.first_forward(ADAPTER)


WORKER_HOOKS: dict[str, Wrap] = {
    "init_device": Wrap(after=_configure_ranks),
    "load_model": common.marks("pre_weight_load", "weights_loaded", _target),
    "initialize_from_config": Wrap(after=_pool_sized, params=(("kv_cache_config", 0),)),
    "compile_or_warm_up_model": common.marks("capture_begin", "capture_end", _target),
    "execute_model": Wrap(after=_step_done),
}

POINTS: tuple[HookPoint, ...] = (
    *common.coordinator_points(PARALLEL_STATE, COORDINATOR_OPS),
    *common.count_points(CUDA_COMMUNICATOR, "CudaCommunicator", COMMUNICATOR_OPS),
    *(
        HookPoint(BASE_COMMUNICATOR, f"DeviceCommunicatorBase.{a}", "read")
        for a in ("unique_name", "ranks", "rank_in_group", "world_size")
    ),
    *common.wrap_points(GPU_WORKER, "Worker", WORKER_HOOKS),
    HookPoint(GPU_WORKER, "Worker.model_runner", "read"),
    HookPoint(KV_CACHE_INTERFACE, "KVCacheConfig.kv_cache_tensors", "read"),
    HookPoint(KV_CACHE_INTERFACE, "KVCacheTensor.size", "read"),
    HookPoint(KV_CACHE_INTERFACE, "KVCacheTensor.host_resident", "read"),
    HookPoint(EXTENSIBLE_KV, "ExtensibleKVCache.physical_bytes", "read", optional=True),
    HookPoint(EXTENSIBLE_KV, "ExtensibleKVCache.size", "read", optional=True),
)


class KvCacheArena:
    """vLLM's KV cache in the arena protocol, holding the model runner weakly (its
    extensible cache, when there is one, is read live; docs/integrations.md)."""

    retained_bytes = None  # unknown: the framework reports no parked handles

    def __init__(self, reserved: int, model_runner: Any) -> None:
        self._reserved = reserved
        self._runner = weakref.ref(model_runner) if model_runner is not None else None

    def _read(self, attr: str) -> int:
        runner = self._runner() if self._runner is not None else None
        extensible = getattr(runner, "extensible_kv_cache", None)
        return self._reserved if extensible is None else int(getattr(extensible, attr))

    def reserved_bytes(self) -> int:
        return self._read("size")

    def backed_bytes(self) -> int:
        return self._read("physical_bytes")


def device_kv_bytes(kv_cache_config: Any) -> int:
    """Bytes of the one device allocation a config asks for: every device-resident
    KVCacheTensor addresses the same backing allocation of ``size`` bytes (cache groups
    overlay each other), so it is counted once; host-resident tensors are not on the card."""
    tensors = kv_cache_config.kv_cache_tensors
    return max((int(t.size) for t in tensors if not getattr(t, "host_resident", False)), default=0)


class VLLMAdapter(Adapter):
    framework = "vllm"
    distribution = "vllm"
    checked_versions = ("0.33.0", "0.34.0")
    points = POINTS
    # vLLM imports its device communicator inside GroupCoordinator.__init__, mid-boot.
    deferred = (CUDA_COMMUNICATOR,)

    def installers(self) -> dict[str, Installer]:
        return {
            PARALLEL_STATE: common.counting(self, COORDINATOR_OPS),
            GPU_WORKER: common.wrapping(self, WORKER_HOOKS),
            # Traced, a communicator method is reached from a counted coordinator method.
            CUDA_COMMUNICATOR: common.counting(self, COMMUNICATOR_OPS, eager_only=COMMUNICATOR_OPS),
        }


ADAPTER = VLLMAdapter()
