"""STAND-IN for vllm.distributed.device_communicators.base_device_communicator (rankscope
tests): the attributes the census reads a device communicator's group from."""

from __future__ import annotations

from typing import Any


class DeviceCommunicatorBase:
    def __init__(
        self, device_group: Any, ranks: list[int], rank_in_group: int, unique_name: str
    ) -> None:
        self.device_group = device_group
        self.ranks = ranks
        self.rank_in_group = rank_in_group
        self.world_size = len(ranks)
        self.unique_name = unique_name
