"""The collective census: per-rank counts of every collective, per group instance and op,
snapshotted at a replicated point so ranks can be compared, and a divergence named before
the job hangs (docs/census.md).

Sources: :func:`count` for frameworks that dispatch their own communicators (pynccl, custom
all-reduce); :func:`instrument_methods` for a coordinator class; opt-in
:func:`instrument_torch_distributed`; CUDA graphs through :func:`capture` / :func:`replay`
or :func:`instrument_cuda_graphs`. Counting is armed unless RANKSCOPE_CENSUS=0; snapshots
land in the flight directory once the recorder is configured.

The package has two halves that meet only at the record (rankscope.schema):

- in the rank: ``counts`` (the counters), ``wrap`` and ``torch_patch`` (the sources),
  ``graphs``, ``snapshots`` (rounds, snapshots, dumps), ``gloo`` (the in-process
  comparison);
- reading records: ``report`` (what ``rankscope census`` and the daemon's /api/v1/census
  print), ``cli``;
- shared, pure: ``naming`` (group instance and p2p op names), ``compare`` and ``rounds``
  (a group's latest common round).

The reading half never imports the in-rank half, and this module imports neither until one
of the names below is first used (PEP 562), so the daemon, which reads census records,
loads no patching code (tests/test_census_report.py checks that in a fresh interpreter). A
name, once loaded, is a plain module attribute: ``census.count`` costs what it always did.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for mypy; at run time __getattr__ loads them
    from rankscope.census.counts import ARMED as ARMED
    from rankscope.census.counts import count as count
    from rankscope.census.counts import snapshot as snapshot
    from rankscope.census.gloo import Comparator as Comparator
    from rankscope.census.gloo import disable_comparison as disable_comparison
    from rankscope.census.gloo import enable_comparison as enable_comparison
    from rankscope.census.graphs import begin_capture as begin_capture
    from rankscope.census.graphs import capture as capture
    from rankscope.census.graphs import end_capture as end_capture
    from rankscope.census.graphs import forget as forget
    from rankscope.census.graphs import instrument_cuda_graphs as instrument_cuda_graphs
    from rankscope.census.graphs import replay as replay
    from rankscope.census.naming import compact_ranks as compact_ranks
    from rankscope.census.naming import group_instance as group_instance
    from rankscope.census.naming import p2p_name as p2p_name
    from rankscope.census.naming import parse_instance as parse_instance
    from rankscope.census.snapshots import configure as configure
    from rankscope.census.snapshots import current_round as current_round
    from rankscope.census.snapshots import dump_local as dump_local
    from rankscope.census.snapshots import install_abort_handlers as install_abort_handlers
    from rankscope.census.snapshots import tick as tick
    from rankscope.census.torch_patch import (
        instrument_torch_distributed as instrument_torch_distributed,
    )
    from rankscope.census.torch_patch import name_group as name_group
    from rankscope.census.torch_patch import (
        uninstrument_torch_distributed as uninstrument_torch_distributed,
    )
    from rankscope.census.wrap import coordinator_group as coordinator_group
    from rankscope.census.wrap import coordinator_p2p as coordinator_p2p
    from rankscope.census.wrap import instrument_methods as instrument_methods

# public name -> the module that defines it
_WHERE = {
    "ARMED": "counts",
    "count": "counts",
    "snapshot": "counts",
    "Comparator": "gloo",
    "disable_comparison": "gloo",
    "enable_comparison": "gloo",
    "begin_capture": "graphs",
    "capture": "graphs",
    "end_capture": "graphs",
    "forget": "graphs",
    "instrument_cuda_graphs": "graphs",
    "replay": "graphs",
    "compact_ranks": "naming",
    "group_instance": "naming",
    "p2p_name": "naming",
    "parse_instance": "naming",
    "configure": "snapshots",
    "current_round": "snapshots",
    "dump_local": "snapshots",
    "install_abort_handlers": "snapshots",
    "tick": "snapshots",
    "instrument_torch_distributed": "torch_patch",
    "name_group": "torch_patch",
    "uninstrument_torch_distributed": "torch_patch",
    "coordinator_group": "wrap",
    "coordinator_p2p": "wrap",
    "instrument_methods": "wrap",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
