"""The collective census: per-rank counts of every collective, per group instance and op,
snapshotted at a replicated point so ranks can be compared, and a divergence named before
the job hangs (docs/census.md).

Sources: :func:`count` for frameworks that dispatch their own communicators (pynccl, custom
all-reduce); :func:`instrument_methods` for a coordinator class; opt-in
:func:`instrument_torch_distributed`; CUDA graphs through :func:`capture` / :func:`replay`
or :func:`instrument_cuda_graphs`. Counting is armed unless RANKSCOPE_CENSUS=0; snapshots
land in the flight directory once the recorder is configured.
"""

from rankscope.census.counts import (
    ARMED,
    compact_ranks,
    count,
    group_instance,
    p2p_name,
    parse_instance,
    snapshot,
)
from rankscope.census.gloo import Comparator, disable_comparison, enable_comparison
from rankscope.census.graphs import (
    begin_capture,
    capture,
    end_capture,
    forget,
    instrument_cuda_graphs,
    replay,
)
from rankscope.census.snapshots import (
    configure,
    current_round,
    dump_local,
    install_abort_handlers,
    tick,
)
from rankscope.census.torch_patch import (
    instrument_torch_distributed,
    name_group,
    uninstrument_torch_distributed,
)
from rankscope.census.wrap import coordinator_group, coordinator_p2p, instrument_methods

__all__ = [
    "ARMED",
    "Comparator",
    "begin_capture",
    "capture",
    "compact_ranks",
    "configure",
    "coordinator_group",
    "coordinator_p2p",
    "count",
    "current_round",
    "disable_comparison",
    "dump_local",
    "enable_comparison",
    "end_capture",
    "forget",
    "group_instance",
    "install_abort_handlers",
    "instrument_cuda_graphs",
    "instrument_methods",
    "instrument_torch_distributed",
    "name_group",
    "p2p_name",
    "parse_instance",
    "replay",
    "snapshot",
    "tick",
    "uninstrument_torch_distributed",
]
