"""STAND-IN for vllm.distributed.parallel_state (rankscope tests): GroupCoordinator shaped
like vLLM's at the methods the adapter counts. It imports its device communicator inside
__init__, as vLLM does (through the platform), so that module arrives mid-boot."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_names: dict[str, int] = {}
_WORLD: GroupCoordinator | None = None
_TP: GroupCoordinator | None = None
_PP: GroupCoordinator | None = None


def _get_unique_name(name: str) -> str:
    index = _names.get(name, 0)
    _names[name] = index + 1
    return f"{name}:{index}"


class GroupCoordinator:
    rank: int
    ranks: list[int]
    world_size: int
    local_rank: int
    rank_in_group: int

    def __init__(self, group_ranks: list[list[int]], local_rank: int, group_name: str) -> None:
        from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

        self.unique_name = _get_unique_name(group_name)
        self.rank = dist.get_rank()
        self.local_rank = local_rank
        for ranks in group_ranks:
            group = dist.new_group(ranks, backend="gloo")
            if self.rank in ranks:
                self.ranks = ranks
                self.world_size = len(ranks)
                self.rank_in_group = ranks.index(self.rank)
                self.device_group = group
        self.device_communicator = CudaCommunicator(
            self.device_group, self.ranks, self.rank_in_group, self.unique_name
        )

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        return self._all_reduce_out_place(input_)

    def _all_reduce_out_place(self, input_: torch.Tensor) -> torch.Tensor:
        return self.device_communicator.all_reduce(input_)

    def _all_gather_out_place(self, input_: torch.Tensor, dim: int) -> torch.Tensor:
        return self.device_communicator.all_gather(input_, dim)

    def _reduce_scatter_out_place(self, input_: torch.Tensor, dim: int) -> torch.Tensor:
        return self.device_communicator.reduce_scatter(input_, dim)

    def all_gatherv(
        self, input_: torch.Tensor, dim: int = 0, sizes: list[int] | None = None
    ) -> Any:
        raise NotImplementedError("stand-in")

    def reduce_scatterv(
        self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None
    ) -> Any:
        raise NotImplementedError("stand-in")

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> Any:
        raise NotImplementedError("stand-in")

    def broadcast(self, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
        dist.broadcast(input_, src=self.ranks[src], group=self.device_group)
        return input_

    def broadcast_object(self, obj: Any | None = None, src: int = 0) -> Any:
        raise NotImplementedError("stand-in")

    def broadcast_tensor_dict(self, tensor_dict: dict[str, Any] | None = None, src: int = 0) -> Any:
        raise NotImplementedError("stand-in")

    def barrier(self) -> None:
        dist.barrier(group=self.device_group)

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        self.device_communicator.send(tensor, dst)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        return self.device_communicator.recv(size, dtype, src)

    def send_object(self, obj: Any, dst: int) -> None:
        raise NotImplementedError("stand-in")

    def recv_object(self, src: int) -> Any:
        raise NotImplementedError("stand-in")

    def send_tensor_dict(self, tensor_dict: dict[str, Any], dst: int | None = None) -> Any:
        raise NotImplementedError("stand-in")

    def recv_tensor_dict(self, src: int | None = None) -> Any:
        raise NotImplementedError("stand-in")

    def isend_object(self, obj: Any, dst: int) -> Any:
        raise NotImplementedError("stand-in")

    def isend_tensor_dict(self, tensor_dict: dict[str, Any], dst: int | None = None) -> Any:
        raise NotImplementedError("stand-in")

    def irecv_tensor_dict(self, src: int | None = None) -> Any:
        raise NotImplementedError("stand-in")

    def reduce_scatterv_into_output(
        self, input_: torch.Tensor, output: torch.Tensor, dim: int = -1, sizes: Any = None
    ) -> Any:
        raise NotImplementedError("stand-in")

    def broadcast_object_list(self, obj_list: list[Any], src: int = 0, group: Any = None) -> Any:
        raise NotImplementedError("stand-in")

    def cpu_all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("stand-in")

    def dispatch_router_logits(self, hidden_states: Any, router_logits: Any) -> Any:
        raise NotImplementedError("stand-in: expert parallelism needs a GPU")

    def dispatch(self, hidden_states: Any, topk_weights: Any, topk_ids: Any) -> Any:
        raise NotImplementedError("stand-in: expert parallelism needs a GPU")

    def combine(self, hidden_states: Any, is_sequence_parallel: bool = False) -> Any:
        raise NotImplementedError("stand-in: expert parallelism needs a GPU")

    def combine_into_output(self, hidden_states: Any, output: Any) -> Any:
        raise NotImplementedError("stand-in: expert parallelism needs a GPU")


def get_world_group() -> GroupCoordinator:
    assert _WORLD is not None
    return _WORLD


def get_tp_group() -> GroupCoordinator:
    assert _TP is not None
    return _TP


def get_pp_group() -> GroupCoordinator:
    assert _PP is not None
    return _PP


def ensure_model_parallel_initialized(tensor_model_parallel_size: int, local_rank: int) -> None:
    global _WORLD, _TP, _PP
    world = dist.get_world_size()
    tp = tensor_model_parallel_size
    _WORLD = GroupCoordinator([list(range(world))], local_rank, "world")
    _TP = GroupCoordinator([list(range(i, i + tp)) for i in range(0, world, tp)], local_rank, "tp")
    _PP = GroupCoordinator([[r] for r in range(world)], local_rank, "pp")
