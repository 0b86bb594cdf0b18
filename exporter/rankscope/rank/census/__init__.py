"""The collective census in the rank (docs/census.md): counts per group instance and op,
snapshotted at a replicated point so ranks can be compared. A name's module loads at its first
use (PEP 562): ``from rankscope import census`` in the daemon loads no patching code."""

from __future__ import annotations

import importlib
from typing import Any

# module -> the public names it defines
_MODULES = {
    "rankscope.rank.census.counts": ("ARMED", "count", "snapshot"),
    "rankscope.rank.census.gloo": ("Comparator", "disable_comparison", "enable_comparison"),
    "rankscope.rank.census.graphs": (
        "begin_capture",
        "capture",
        "end_capture",
        "forget",
        "instrument_cuda_graphs",
        "replay",
    ),
    "rankscope.rank.census.snapshots": (
        "configure",
        "current_round",
        "dump_local",
        "install_abort_handlers",
        "tick",
    ),
    "rankscope.rank.census.torch_patch": (
        "instrument_torch_distributed",
        "name_group",
        "uninstrument_torch_distributed",
    ),
    "rankscope.rank.census.watcher": ("start_watcher", "stop_watcher"),
    "rankscope.rank.census.wrap": ("coordinator_group", "coordinator_p2p", "instrument_methods"),
    "rankscope.record.naming": ("compact_ranks", "group_instance", "p2p_name", "parse_instance"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
