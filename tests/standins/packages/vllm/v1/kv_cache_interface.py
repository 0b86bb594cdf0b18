"""STAND-IN for vllm.v1.kv_cache_interface (rankscope tests): the KV cache config a worker
is given, with the real fields: every tensor places its layers in ONE backing allocation of
``size`` bytes (cache groups overlay each other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KVCacheTensor:
    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int
    offset: int = 0
    host_resident: bool = False


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
