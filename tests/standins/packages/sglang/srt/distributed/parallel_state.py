"""STAND-IN for sglang.srt.distributed.parallel_state (rankscope tests): GroupCoordinator
shaped like SGLang's at the methods the adapter counts, routing an all-reduce through a
custom-op-like function to a private method and on to torch.distributed (gloo here), as
SGLang routes it to custom all-reduce / pynccl / torch.distributed."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist

_groups: dict[str, Any] = {}
_names: dict[str, int] = {}
_WORLD: GroupCoordinator | None = None
_TP: GroupCoordinator | None = None
_PP: GroupCoordinator | None = None


def _get_unique_name(name: str) -> str:
    index = _names.get(name, 0)
    _names[name] = index + 1
    return f"{name}:{index}"


def inplace_all_reduce(tensor: torch.Tensor, group_name: str) -> None:
    """The custom op's implementation: look the group up by name, call its private method."""
    _groups[group_name]()._all_reduce_in_place(tensor)


class GroupCoordinator:
    rank: int
    ranks: list[int]
    world_size: int
    local_rank: int
    rank_in_group: int

    def __init__(self, group_ranks: list[list[int]], local_rank: int, group_name: str) -> None:
        self.unique_name = _get_unique_name(group_name)
        _groups[self.unique_name] = weakref.ref(self)
        self.rank = dist.get_rank()
        self.local_rank = local_rank
        for ranks in group_ranks:
            group = dist.new_group(ranks, backend="gloo")
            if self.rank in ranks:
                self.ranks = ranks
                self.world_size = len(ranks)
                self.rank_in_group = ranks.index(self.rank)
                self.device_group = group

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        inplace_all_reduce(input_, group_name=self.unique_name)
        return input_

    def _all_reduce_out_place(
        self, input_: torch.Tensor, outplace_all_reduce_method: str
    ) -> torch.Tensor:
        out = input_.clone()
        dist.all_reduce(out, group=self.device_group)
        return out

    def _all_reduce_in_place(self, input_: torch.Tensor) -> None:
        dist.all_reduce(input_, group=self.device_group)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._all_gather_into_tensor(output, input)

    def _all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        dist.all_gather_into_tensor(output, input, group=self.device_group)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        out = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(out, input_, group=self.device_group)
        return torch.cat(out, dim=dim)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._reduce_scatter_tensor(output, input)

    def _reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        dist.reduce_scatter_tensor(output, input, group=self.device_group)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._all_to_all_single(output, input)

    def _all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        dist.all_to_all_single(output, input, group=self.device_group)

    def broadcast(self, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
        dist.broadcast(input_, src=self.ranks[src], group=self.device_group)
        return input_

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        raise NotImplementedError("stand-in")

    def barrier(self) -> None:
        dist.barrier(group=self.device_group)

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        if dst is None:
            dst = (self.rank_in_group + 1) % self.world_size
        dist.send(tensor, self.ranks[dst], group=self.device_group)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        if src is None:
            src = (self.rank_in_group - 1) % self.world_size
        tensor = torch.empty(size, dtype=dtype)
        dist.recv(tensor, self.ranks[src], group=self.device_group)
        return tensor

    def send_object(self, obj: Any, dst: int) -> None:
        raise NotImplementedError("stand-in")

    def recv_object(self, src: int) -> Any:
        raise NotImplementedError("stand-in")

    def _flashinfer_allreduce(self, input_: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("stand-in: FlashInfer needs a GPU")

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor]) -> None:
        dist.reduce_scatter(output, input_list, group=self.device_group)

    def all_gatherv(self, input_: Any, sizes: Any = None, output: Any = None) -> Any:
        raise NotImplementedError("stand-in: pynccl needs a GPU")

    def reduce_scatterv(self, input_: Any, output: Any = None, sizes: Any = None) -> Any:
        raise NotImplementedError("stand-in: pynccl needs a GPU")

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        raise NotImplementedError("stand-in")

    def broadcast_object_list(self, obj_list: list[Any], src: int = 0, group: Any = None) -> None:
        raise NotImplementedError("stand-in")

    def broadcast_tensor_dict(self, tensor_dict: Any = None, src: int = 0) -> Any:
        raise NotImplementedError("stand-in")

    def all_gather_object(self, obj: Any) -> list[Any]:
        raise NotImplementedError("stand-in")

    def send_tensor_dict(self, tensor_dict: dict[str, Any], dst: int | None = None) -> Any:
        raise NotImplementedError("stand-in")

    def recv_tensor_dict(self, src: int | None = None) -> Any:
        raise NotImplementedError("stand-in")


def get_world_group() -> GroupCoordinator:
    assert _WORLD is not None
    return _WORLD


def get_tp_group() -> GroupCoordinator:
    assert _TP is not None
    return _TP


def get_pp_group() -> GroupCoordinator:
    assert _PP is not None
    return _PP


def initialize_model_parallel(tensor_model_parallel_size: int, local_rank: int) -> None:
    """World, TP and PP coordinators (PP of size 1 per rank, as with --pp-size 1)."""
    global _WORLD, _TP, _PP
    world = dist.get_world_size()
    tp = tensor_model_parallel_size
    _WORLD = GroupCoordinator([list(range(world))], local_rank, "world")
    _TP = GroupCoordinator([list(range(i, i + tp)) for i in range(0, world, tp)], local_rank, "tp")
    _PP = GroupCoordinator([[r] for r in range(world)], local_rank, "pp")
