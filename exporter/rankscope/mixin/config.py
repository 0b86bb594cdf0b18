"""The mixin's one configuration place: selectors, thresholds, windows and `for:` durations.

As in the monitoring mixins' ``_config``, every value is text pasted into PromQL or a rule
field as is, so a caller may pass a Helm template reference instead (the chart sync does).
docs/alerting.md documents each knob; a test keeps that page and this dict in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A mixin config: DEFAULTS with a caller's overrides applied (what merged() returns).
Config = Mapping[str, Any]

DEFAULTS: dict[str, Any] = {
    # Label matchers that select rankscope's own series (the daemon's scrape job).
    "selector": 'job="rankscope"',
    # Labels that name one daemon (a scrape target), and one card of one daemon; joins
    # between a daemon's or a card's series match on them.
    "daemonLabels": "job, instance",
    "cardLabels": "job, instance, gpu, uuid",
    # Base of every alert's runbook_url; the alert's anchor is appended after '#'.
    "runbookUrl": "https://github.com/rankscope/rankscope/blob/main/docs/runbook.md",
    # RankscopeCorridorBreach: any time below the floor within this window pages.
    "corridorBreachWindow": "5m",
    "corridorBreachFor": "0s",
    # RankscopeCorridorThin: margin below this share of the floor, sustained.
    "corridorThinShare": 0.25,
    "corridorThinFor": "10m",
    # RankscopeCensusSkew: ranks at the same round disagreed within the lookback (a rank one
    # iteration ahead stands alone at a new round at some scrapes), for this long.
    "censusSkewLookback": "2m",
    "censusSkewFor": "1m",
    # RankscopeCensusHang: ranks of a group standing still at different counts, or a dead
    # rank, for this long.
    "censusHangFor": "10s",
    # RankscopeCensusStalled: a live rank's latest snapshot is older than this many seconds.
    "censusStallSeconds": 300,
    "censusStalledFor": "1m",
    # RankscopeForeignHolder: a foreign process holds more than this many bytes, sustained.
    "foreignHolderMinBytes": 0,
    "foreignHolderFor": "2m",
    # RankscopeOutOfMemory: an OOM instant (probe or sampler) within this window pages.
    "oomWindow": "10m",
    "oomFor": "0s",
    # RankscopeExporterDown: the target or one of its sources is down this long.
    "exporterDownFor": "5m",
    # RankscopeSamplerLagging: share of samples that started late, over the window; or a
    # sampler that took no sample at all in the window while the daemon has cards.
    "samplerOverrunShare": 0.05,
    "samplerLagWindow": "5m",
    "samplerLaggingFor": "10m",
    # RankscopeNcclCountMismatch: the daemon already requires the mismatch to persist over
    # --collector.nccl-ras.persist-polls polls with stuck laggards; this is its `for:`.
    "ncclCountMismatchFor": "1m",
    # RankscopeNcclPeerDead: RAS declares a peer dead after 60 s unreachable; page at once.
    "ncclPeerDeadFor": "0s",
    # Evaluation interval of the alerts whose `for:` is minutes (foreign holder, thin
    # corridor, exporter down, sampler lagging): they fire up to this much after their `for:`.
    "slowAlertsInterval": "1m",
}


def merged(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """DEFAULTS with ``overrides`` applied; an unknown key is an error, not a silent no-op."""
    if unknown := [key for key in overrides or {} if key not in DEFAULTS]:
        raise KeyError(f"unknown mixin config key {unknown[0]!r}; known: {', '.join(DEFAULTS)}")
    return {**DEFAULTS, **(overrides or {})}
