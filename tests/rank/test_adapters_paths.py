"""Every collective path an adapter counts, on a class with the REAL signatures: each counted
method is rebuilt from the manifest (the newest checked version's parameters, read from the
wheel) with a body that does nothing, counted through the adapter's own tables, and called
as the framework calls it (a p2p peer at its position, and by keyword). One count per call,
under the op and group the adapter says; a group of one rank counts nothing.
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from rankscope.rank.adapters import common, manifest, sglang, vllm
from rankscope.rank.census import counts
from rankscope.record.naming import p2p_name

MANIFEST = json.loads(manifest.MANIFEST_PATH.read_text(encoding="utf-8"))
RANKS = (4, 5, 6, 7)
GROUP = "tp:4-7"

# (adapter, module, class, its table, methods traced into another counted one)
TABLES = (
    (sglang.ADAPTER, sglang.PARALLEL_STATE, "GroupCoordinator", sglang.COORDINATOR_OPS),
    (vllm.ADAPTER, vllm.PARALLEL_STATE, "GroupCoordinator", vllm.COORDINATOR_OPS),
    (vllm.ADAPTER, vllm.CUDA_COMMUNICATOR, "CudaCommunicator", vllm.COMMUNICATOR_OPS),
)
CASES = [
    pytest.param(adapter, module, cls, method, op, id=f"{adapter.framework}-{cls}.{method}")
    for adapter, module, cls, table in TABLES
    for method, op in table.items()
]


def _real_params(framework: str, module: str, cls: str, method: str) -> list[str]:
    version = max(MANIFEST["frameworks"][framework], key=lambda v: tuple(map(int, v.split("."))))
    entry = MANIFEST["frameworks"][framework][version]["modules"][module]["classes"][cls]
    return [name for name, _ in entry["methods"][method]["params"]]


def _coordinator_class(cls: str, method: str, params: list[str], world_size: int) -> type:
    """A class named like the framework's, with ``method`` taking the real parameters (all
    defaulting to None) and doing nothing."""
    source = f"def {method}(self, {''.join(f'{p}=None, ' for p in params)}):\n    return None\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<{cls}.{method}>", "exec"), namespace)
    ranks = RANKS[:world_size]
    attributes = {
        "unique_name": "tp:0",
        "ranks": ranks,
        "world_size": world_size,
        "rank_in_group": 0,
        method: namespace[method],
    }
    return type(cls, (), attributes)


@pytest.mark.parametrize(("adapter", "module", "cls", "method", "op"), CASES)
def test_each_counted_path_counts_once_per_call(adapter, module, cls, method, op):
    params = _real_params(adapter.framework, module, cls, method)
    klass = _coordinator_class(cls, method, params, world_size=len(RANKS))
    points = [p for p in adapter.points if p.module == module and p.qualname == f"{cls}.{method}"]
    undo = common.count_methods(types.SimpleNamespace(**{cls: klass}), points, {method: op})[0]
    counts.reset()
    try:
        instance = klass()
        if isinstance(op, str):
            getattr(instance, method)()
            getattr(instance, method)()
            assert counts.snapshot() == {(GROUP, op): 2}
        else:
            kind, peer_param, position = op
            assert params[position] == peer_param
            getattr(instance, method)(*([None] * position), 2)  # the peer positionally
            getattr(instance, method)(**{peer_param: 3})  # and by keyword
            assert counts.snapshot() == {
                (GROUP, p2p_name(kind, RANKS[2])): 1,
                (GROUP, p2p_name(kind, RANKS[3])): 1,
            }
    finally:
        undo()
        counts.reset()


@pytest.mark.parametrize(("adapter", "module", "cls", "method", "op"), CASES[:3])
def test_a_group_of_one_rank_counts_nothing(adapter, module, cls, method, op):
    params = _real_params(adapter.framework, module, cls, method)
    klass = _coordinator_class(cls, method, params, world_size=1)
    points = [p for p in adapter.points if p.module == module and p.qualname == f"{cls}.{method}"]
    undo = common.count_methods(types.SimpleNamespace(**{cls: klass}), points, {method: op})[0]
    counts.reset()
    try:
        getattr(klass(), method)()
        assert counts.snapshot() == {}
    finally:
        undo()
