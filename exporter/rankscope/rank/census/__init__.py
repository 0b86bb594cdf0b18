"""The collective census in the rank (docs/census.md): counts per group instance and op,
snapshotted at a replicated point so ranks can be compared. A name's module loads at its first
use (PEP 562): ``from rankscope import census`` in the daemon loads no patching code."""

from __future__ import annotations

import importlib
from typing import Any

# module (relative to this package) -> the public names it defines
_MODULES = {
    ".counts": "ARMED count snapshot",
    ".gloo": "Comparator disable_comparison enable_comparison",
    ".graphs": "begin_capture capture end_capture forget instrument_cuda_graphs replay",
    ".snapshots": "configure current_round dump_local install_abort_handlers tick"
    " start_watcher stop_watcher",
    ".torch_patch": "instrument_torch_distributed name_group uninstrument_torch_distributed",
    ".wrap": "coordinator_group coordinator_p2p instrument_methods",
    "rankscope.record.naming": "compact_ranks group_instance p2p_name parse_instance",
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names.split()}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
