"""The collective census: per-rank counts of every collective, per group instance and op,
snapshotted at a replicated point so ranks can be compared, and a divergence named before
the job hangs (docs/census.md).

Sources: :func:`count` for frameworks that dispatch their own communicators (pynccl, custom
all-reduce); :func:`instrument_methods` for a coordinator class; opt-in
:func:`instrument_torch_distributed`; CUDA graphs through :func:`capture` / :func:`replay`
or :func:`instrument_cuda_graphs`. Counting is armed unless RANKSCOPE_CENSUS=0; snapshots
land in the flight directory once the recorder is configured.

The package has two halves that meet only at the record (rankscope.record.schema):

- in the rank: ``counts`` (the counters), ``wrap`` and ``torch_patch`` (the sources),
  ``graphs``, ``snapshots`` (rounds, snapshots, dumps), ``gloo`` (the in-process
  comparison);
- reading records: ``report`` (what ``rankscope census`` and the daemon's /api/v1/census
  print), ``cli``;
- shared, pure: ``naming`` (group instance and p2p op names), ``compare`` and ``rounds``
  (a group's latest common round).

The reading half never imports the in-rank half, and this module imports neither until one
of the names below is first used (PEP 562), so the daemon, which reads census records,
loads no patching code (tests/reports/test_census_report.py checks that in a fresh interpreter). A
name, once loaded, is a plain module attribute: ``census.count`` costs what it always did.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for mypy; at run time __getattr__ loads them
    from rankscope.rank.census.counts import ARMED as ARMED
    from rankscope.rank.census.counts import count as count
    from rankscope.rank.census.counts import snapshot as snapshot
    from rankscope.rank.census.gloo import Comparator as Comparator
    from rankscope.rank.census.gloo import disable_comparison as disable_comparison
    from rankscope.rank.census.gloo import enable_comparison as enable_comparison
    from rankscope.rank.census.graphs import begin_capture as begin_capture
    from rankscope.rank.census.graphs import capture as capture
    from rankscope.rank.census.graphs import end_capture as end_capture
    from rankscope.rank.census.graphs import forget as forget
    from rankscope.rank.census.graphs import instrument_cuda_graphs as instrument_cuda_graphs
    from rankscope.rank.census.graphs import replay as replay
    from rankscope.rank.census.snapshots import configure as configure
    from rankscope.rank.census.snapshots import current_round as current_round
    from rankscope.rank.census.snapshots import dump_local as dump_local
    from rankscope.rank.census.snapshots import install_abort_handlers as install_abort_handlers
    from rankscope.rank.census.snapshots import tick as tick
    from rankscope.rank.census.torch_patch import (
        instrument_torch_distributed as instrument_torch_distributed,
    )
    from rankscope.rank.census.torch_patch import name_group as name_group
    from rankscope.rank.census.torch_patch import (
        uninstrument_torch_distributed as uninstrument_torch_distributed,
    )
    from rankscope.rank.census.wrap import coordinator_group as coordinator_group
    from rankscope.rank.census.wrap import coordinator_p2p as coordinator_p2p
    from rankscope.rank.census.wrap import instrument_methods as instrument_methods
    from rankscope.record.naming import compact_ranks as compact_ranks
    from rankscope.record.naming import group_instance as group_instance
    from rankscope.record.naming import p2p_name as p2p_name
    from rankscope.record.naming import parse_instance as parse_instance

# public name -> the module that defines it
_WHERE = {
    "ARMED": "rankscope.rank.census.counts",
    "count": "rankscope.rank.census.counts",
    "snapshot": "rankscope.rank.census.counts",
    "Comparator": "rankscope.rank.census.gloo",
    "disable_comparison": "rankscope.rank.census.gloo",
    "enable_comparison": "rankscope.rank.census.gloo",
    "begin_capture": "rankscope.rank.census.graphs",
    "capture": "rankscope.rank.census.graphs",
    "end_capture": "rankscope.rank.census.graphs",
    "forget": "rankscope.rank.census.graphs",
    "instrument_cuda_graphs": "rankscope.rank.census.graphs",
    "replay": "rankscope.rank.census.graphs",
    "compact_ranks": "rankscope.record.naming",
    "group_instance": "rankscope.record.naming",
    "p2p_name": "rankscope.record.naming",
    "parse_instance": "rankscope.record.naming",
    "configure": "rankscope.rank.census.snapshots",
    "current_round": "rankscope.rank.census.snapshots",
    "dump_local": "rankscope.rank.census.snapshots",
    "install_abort_handlers": "rankscope.rank.census.snapshots",
    "tick": "rankscope.rank.census.snapshots",
    "instrument_torch_distributed": "rankscope.rank.census.torch_patch",
    "name_group": "rankscope.rank.census.torch_patch",
    "uninstrument_torch_distributed": "rankscope.rank.census.torch_patch",
    "coordinator_group": "rankscope.rank.census.wrap",
    "coordinator_p2p": "rankscope.rank.census.wrap",
    "instrument_methods": "rankscope.rank.census.wrap",
}

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
