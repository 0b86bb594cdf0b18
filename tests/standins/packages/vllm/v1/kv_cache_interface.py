"""STAND-IN for vllm.v1.kv_cache_interface (rankscope tests): the KV cache config a worker
is given, with the fields the adapter reads."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list[str] = field(default_factory=list)


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
