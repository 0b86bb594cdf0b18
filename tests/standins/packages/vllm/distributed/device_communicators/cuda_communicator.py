"""STAND-IN for vllm.distributed.device_communicators.cuda_communicator (rankscope tests):
CudaCommunicator's collectives over torch.distributed (gloo) where vLLM uses pynccl, custom
all-reduce or symmetric memory."""

from __future__ import annotations

import torch
import torch.distributed as dist

from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase


class CudaCommunicator(DeviceCommunicatorBase):
    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        out = input_.clone()
        dist.all_reduce(out, group=self.device_group)
        return out

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        out = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(out, input_, group=self.device_group)
        return torch.cat(out, dim=dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        raise NotImplementedError("stand-in")

    def all_gatherv(
        self, input_: torch.Tensor, dim: int = 0, sizes: list[int] | None = None
    ) -> torch.Tensor:
        raise NotImplementedError("stand-in")

    def reduce_scatterv(
        self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None
    ) -> torch.Tensor:
        raise NotImplementedError("stand-in")

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        dist.broadcast(tensor, self.ranks[src], group=self.device_group)
        return tensor

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
