"""The collectors, node_exporter's way: one module each, listed in :data:`COLLECTORS`.

A collector module has ``NAME`` (its ``--collector.NAME`` / ``--no-collector.NAME`` switch
and the ``collector`` label of rankscope_collector_success), ``HELP``, ``DEFAULT`` (on,
off, or None for always on without a switch) and ``build(config, sources)``, which returns
the collector (rankscope.daemon.registry.Collector) reading the sources it asks for. It may
add flags of its own with ``add_flags(parser)``, whose values the config holds as its
``Options`` (a frozen dataclass, one field per flag destination). The list's order is the
scrape order; CONTRIBUTING.md, "Add a collector", walks through adding one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from rankscope.daemon.collectors import (
    arenas,
    cards,
    census,
    holdings,
    nccl_ras,
    oom,
    phases,
    self_,
)

if TYPE_CHECKING:
    from rankscope.daemon.config import DaemonConfig
    from rankscope.daemon.registry import Collector
    from rankscope.daemon.sources import Sources


class CollectorModule(Protocol):
    @property
    def NAME(self) -> str: ...

    @property
    def HELP(self) -> str: ...

    @property
    def DEFAULT(self) -> bool | None: ...

    def build(self, config: DaemonConfig, sources: Sources) -> Collector: ...


COLLECTORS: list[CollectorModule] = [self_, phases, arenas, census, oom, cards, holdings, nccl_ras]
