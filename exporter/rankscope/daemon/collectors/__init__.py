"""The collector modules in scrape order (CONTRIBUTING.md, "Add a collector")."""

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
    NAME: str
    HELP: str

    @property  # read-only, so that a module's ``DEFAULT = True`` (a bool) fits
    def DEFAULT(self) -> bool | None: ...

    def build(self, config: DaemonConfig, sources: Sources) -> Collector: ...


COLLECTORS: list[CollectorModule] = [self_, phases, arenas, census, oom, cards, holdings, nccl_ras]
