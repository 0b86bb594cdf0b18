"""STAND-IN for sglang.srt.mem_cache.kv_vmm_backing (rankscope tests): the VMM owner a
post-capture KV pool holds, with the committed byte count the adapter reads as backed."""

from __future__ import annotations


class KvVmmBufferOwner:
    def __init__(self, backed: int) -> None:
        self._backed = backed

    @property
    def backed_bytes(self) -> int:
        return self._backed
