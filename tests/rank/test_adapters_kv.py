"""The KV arenas, per pool class of the checked versions. The pools here are STAND-INS named
after SGLang's and vLLM's classes, carrying only the members the adapters read (each one a
hook point the manifest holds from the real wheels: checked below); their sizes need CUDA
or, for post-capture VMM and unified memory, a GPU's virtual memory. The real CPU classes
are read by scripts/adapters-real.sh.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.rank.test_adapters_manifest import MANIFEST, check

from rankscope.rank.adapters import sglang, vllm
from rankscope.rank.probe.arenas import read_arena
from rankscope.record import MarkArena

MIB = 1 << 20


def _pool(cls: str, **members: Any) -> Any:
    """An object of a class named ``cls`` with ``members``: callables become methods, the
    rest attributes (SGLang's properties read the same)."""
    methods = {k: (lambda self, v=v: v()) for k, v in members.items() if callable(v)}
    instance = type(cls, (), methods)()
    for name, value in members.items():
        if not callable(value):
            setattr(instance, name, value)
    return instance


def _unified(total: int, backed: int | None = None) -> Any:
    vmm = {"post_capture_active": backed is not None, "post_capture_backed_bytes": backed}
    return _pool("UnifiedKVPool", total_bytes=total, **vmm)


UNKNOWN_RETAINED = "arena reports retained_bytes as unknown"


def _sized(reserved: int, backed: int) -> MarkArena:
    """The arena a pool of known size reads as (no pool reports what it retains)."""
    return MarkArena(reserved, backed, None, UNKNOWN_RETAINED)


def _case(case_id: str, pool: Any, expected: MarkArena, *, draft: bool = False) -> Any:
    return pytest.param(pool, draft, expected, id=case_id)


def _post_capture(cls: str, half: int, backed: int) -> Any:
    """A pool of two ``half``-sized K/V buffers, ``backed`` of them mapped after capture."""
    return _pool(
        cls,
        get_kv_size_bytes=lambda: (half, half),
        post_capture_active=True,
        post_capture_backed_bytes=backed,
    )


def _unified_front(cls: str, **members: Any) -> Any:
    """A unified pool's front: its own size reads (0, 0), the unified buffer holds the total."""
    return _pool(cls, get_kv_size_bytes=lambda: (0, 0), **members)


NO_SIZE = 'LookupError("SGLang\'s DeepSeekV4TokenToKVPool does not report its size")'

SGLANG_CASES = [
    _case(
        "MHATokenToKVPool",
        _pool("MHATokenToKVPool", get_kv_size_bytes=lambda: (3 * MIB, 3 * MIB)),
        _sized(6 * MIB, 6 * MIB),
    ),
    _case(
        "MLATokenToKVPool",
        _pool("MLATokenToKVPool", get_kv_size_bytes=lambda: 5 * MIB),
        _sized(5 * MIB, 5 * MIB),
    ),
    _case(
        "MHATokenToKVPool-post-capture-vmm",
        _post_capture("MHATokenToKVPool", 8 * MIB, 4 * MIB),
        _sized(16 * MIB, 4 * MIB),
    ),
    _case(  # SGLang's backed bytes: the full-attention pool's
        "HybridLinearKVPool-post-capture-vmm",
        _post_capture("HybridLinearKVPool", 8 * MIB, 2 * MIB),
        _sized(16 * MIB, 2 * MIB),
    ),
    _case(  # SGLang's backed bytes: full + sliding-window pools
        "SWAKVPool-post-capture-vmm",
        _post_capture("SWAKVPool", 10 * MIB, 3 * MIB),
        _sized(20 * MIB, 3 * MIB),
    ),
    _case(
        "UnifiedMHATokenToKVPool",
        _unified_front("UnifiedMHATokenToKVPool", _unified_buffer=_unified(64 * MIB)),
        _sized(64 * MIB, 64 * MIB),
    ),
    _case(
        "UnifiedMLATokenToKVPool-post-capture-vmm",
        _unified_front(
            "UnifiedMLATokenToKVPool", _unified_buffer=_unified(64 * MIB, backed=24 * MIB)
        ),
        _sized(64 * MIB, 24 * MIB),
    ),
    _case(
        "UnifiedSWAKVPool",
        _unified_front("UnifiedSWAKVPool", unified_buffer=_unified(32 * MIB)),
        _sized(32 * MIB, 32 * MIB),
    ),
    _case(
        "UnifiedHybridLinearKVPool",
        _unified_front(
            "UnifiedHybridLinearKVPool",
            full_kv_pool=_pool("UnifiedMHATokenToKVPool", _unified_buffer=_unified(48 * MIB)),
        ),
        _sized(48 * MIB, 48 * MIB),
    ),
    _case(  # fused into the target's unified entries
        "UnifiedDraftKVPool-in-kv_draft",
        _unified_front("UnifiedDraftKVPool", _unified_buffer=_unified(64 * MIB, backed=24 * MIB)),
        _sized(0, 0),
        draft=True,
    ),
    _case(
        "DeepSeekV4TokenToKVPool",
        _pool("DeepSeekV4TokenToKVPool"),
        MarkArena(
            None,
            None,
            None,
            f"reserved_bytes raised {NO_SIZE}; backed_bytes raised {NO_SIZE}; {UNKNOWN_RETAINED}",
        ),
    ),
]


@pytest.mark.parametrize(("pool", "draft", "expected"), SGLANG_CASES)
def test_sglang_kv_arena_per_pool_class(pool, draft, expected):
    assert read_arena(sglang.KvPoolArena(pool, draft=draft)) == expected


def _tensor(size: int, offset: int = 0, host: bool = False) -> Any:
    return _pool("KVCacheTensor", size=size, offset=offset, host_resident=host)


def test_vllm_kv_config_counts_its_one_device_allocation_once():
    """Two cache groups' tensors overlay one 8 MiB backing allocation (each says size=8 MiB);
    a host-resident tensor is not on the card."""
    config = _pool(
        "KVCacheConfig",
        kv_cache_tensors=[_tensor(8 * MIB), _tensor(8 * MIB, 4 * MIB), _tensor(2 * MIB, host=True)],
    )
    arena = vllm.KvCacheArena(vllm.device_kv_bytes(config), None)
    assert read_arena(arena) == _sized(8 * MIB, 8 * MIB)


def test_vllm_extensible_kv_cache_reserves_its_padded_size_and_backs_what_it_committed():
    runner = _pool(
        "GPUModelRunner",
        extensible_kv_cache=_pool("ExtensibleKVCache", size=10 * MIB, physical_bytes=3 * MIB),
    )
    arena = vllm.KvCacheArena(8 * MIB, runner)  # the unpadded config asked for 8 MiB
    assert read_arena(arena) == _sized(10 * MIB, 3 * MIB)


READS = {
    "sglang": {
        ("MHATokenToKVPool", "get_kv_size_bytes"),
        ("MLATokenToKVPool", "get_kv_size_bytes"),
        ("HybridLinearKVPool", "get_kv_size_bytes"),
        ("KVCache", "post_capture_active"),
        ("MHATokenToKVPool", "post_capture_backed_bytes"),
        ("HybridLinearKVPool", "post_capture_backed_bytes"),
        ("SWAKVPool", "post_capture_backed_bytes"),
        ("UnifiedKVPool", "total_bytes"),
        ("UnifiedKVPool", "post_capture_backed_bytes"),
        ("UnifiedMHATokenToKVPool", "_unified_buffer"),
        ("UnifiedSWAKVPool", "unified_buffer"),
        ("HybridLinearKVPool", "full_kv_pool"),
    },
    "vllm": {
        ("KVCacheTensor", "size"),
        ("KVCacheTensor", "host_resident"),
        ("ExtensibleKVCache", "size"),
        ("ExtensibleKVCache", "physical_bytes"),
    },
}


@pytest.mark.parametrize("adapter", [sglang.ADAPTER, vllm.ADAPTER], ids=lambda a: a.framework)
def test_the_members_these_stand_ins_carry_are_hook_points_of_the_real_classes(adapter):
    points = {tuple(p.qualname.split(".", 1)) for p in adapter.points if p.use == "read"}
    assert READS[adapter.framework] <= points
    assert check(adapter, MANIFEST) == []
