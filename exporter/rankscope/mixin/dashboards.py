"""The Grafana dashboards, built in plain Python so they share selectors and layout.

``build()`` returns file name -> dashboard JSON. Every dashboard is provisioned by its uid,
reads Prometheus through a ``datasource`` variable, and filters with label_values variables
(host = ``instance``; boot and card where the metrics carry them). Schema version 39 is what
Grafana 10.4 and 11 write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankscope.mixin.config import merged

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["rankscope"]
_WIDTH = 24


def _target(expr: str, legend: str = "", *, instant: bool = False, ref: str = "A") -> dict:
    target: dict[str, Any] = {
        "datasource": DATASOURCE,
        "expr": expr,
        "refId": ref,
        "legendFormat": legend or "__auto",
    }
    if instant:
        target.update({"instant": True, "range": False, "format": "table"})
    else:
        target.update({"instant": False, "range": True})
    return target


def _targets(*queries: tuple[str, str], instant: bool = False) -> list[dict]:
    return [
        _target(expr, legend, instant=instant, ref=chr(ord("A") + n))
        for n, (expr, legend) in enumerate(queries)
    ]


def timeseries(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    *,
    unit: str = "short",
    width: int = 12,
    stack: bool = False,
    overrides: list[dict] | None = None,
) -> dict:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
    if stack:
        custom.update({"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60})
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(*queries),
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": overrides or []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["min", "last"]},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "_width": width,
    }


def table(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    *,
    unit: str = "short",
    width: int = 12,
    overrides: list[dict] | None = None,
) -> dict:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(*queries, instant=True),
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": overrides or []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        # One table from several instant queries, one row per series.
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True, "job": True}}},
        ],
        "_width": width,
    }


def _foreign_stands_out() -> list[dict]:
    """Table override: the role column turns red for foreign processes."""
    return [
        {
            "matcher": {"id": "byName", "options": "role"},
            "properties": [
                {
                    "id": "mappings",
                    "value": [
                        {
                            "type": "value",
                            "options": {
                                "foreign": {"color": "red", "index": 0, "text": "FOREIGN"},
                                "rank": {"color": "green", "index": 1},
                                "overflow": {"color": "orange", "index": 2},
                            },
                        }
                    ],
                },
                {"id": "custom.cellOptions", "value": {"type": "color-background"}},
            ],
        }
    ]


def _datasource_variable() -> dict:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def _query_variable(name: str, label: str, query: str, *, include_all: bool = True) -> dict:
    """A multi-value variable; without ``include_all`` Grafana opens on the first value,
    where "All" over a fleet would draw every process or count series of every host."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"rankscope-{name}", "qryType": 1},
        "refresh": 2,
        "includeAll": include_all,
        "allValue": ".*",
        "multi": True,
        "sort": 1,
        "current": {},
        "options": [],
        "hide": 0,
        "regex": "",
    }


def _layout(panels: list[dict]) -> list[dict]:
    """Place panels left to right in rows of 24 columns, 8 rows high; number them."""
    placed = []
    x = y = 0
    for n, panel in enumerate(panels, start=1):
        panel = dict(panel)
        width = panel.pop("_width")
        if x + width > _WIDTH:
            x, y = 0, y + 8
        panel["id"] = n
        panel["gridPos"] = {"h": 8, "w": width, "x": x, "y": y}
        placed.append(panel)
        x += width
    return placed


def _dashboard(
    uid: str, title: str, description: str, variables: list[dict], panels: list[dict]
) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": TAGS,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": TAGS, "asDropdown": True, "title": "rankscope"}],
        "templating": {"list": [_datasource_variable(), *variables]},
        "panels": _layout(panels),
    }


def cards(c: Mapping[str, Any]) -> dict:
    s = c["selector"]
    card = f'{s}, instance=~"$instance", gpu=~"$gpu"'
    return _dashboard(
        "rankscope-cards",
        "rankscope / Cards",
        "Per card: free memory at its worst instant against the corridor floor, time below "
        "the floor, who holds the memory (ranks, foreign processes) and the card identity.",
        [
            _query_variable(
                "instance",
                "Host",
                f"label_values(rankscope_gpu_total_bytes{{{s}}}, instance)",
                include_all=False,
            ),
            _query_variable(
                "gpu",
                "Card",
                f'label_values(rankscope_gpu_total_bytes{{{s}, instance=~"$instance"}}, gpu)',
            ),
            _query_variable(
                "boot",
                "Boot",
                f'label_values(rankscope_gpu_process_bytes{{{s}, instance=~"$instance", role="rank"}}, boot)',
            ),
        ],
        [
            timeseries(
                "Free memory, window minimum and floor",
                "Latest free memory, its minimum over the sampler's trailing window (the worst "
                "instant, a trough between scrapes included) and the card's floor.",
                [
                    (f"rankscope_gpu_free_bytes{{{card}}}", "{{instance}} gpu {{gpu}} free"),
                    (
                        f"rankscope_gpu_free_min_bytes{{{card}}}",
                        "{{instance}} gpu {{gpu}} window min",
                    ),
                    (f"rankscope_corridor_floor_bytes{{{card}}}", "{{instance}} gpu {{gpu}} floor"),
                ],
                unit="bytes",
            ),
            timeseries(
                "Corridor margin",
                "Worst-instant free memory minus the floor (signed); below zero is a breach.",
                [(f"rankscope:corridor_margin_bytes{{{card}}}", "{{instance}} gpu {{gpu}}")],
                unit="bytes",
            ),
            timeseries(
                "Time below the floor",
                "Seconds per interval the card's free memory spent below its floor, and how "
                "many times it crossed below.",
                [
                    (
                        f"increase(rankscope_corridor_breach_seconds_total{{{card}}}[$__rate_interval])",
                        "{{instance}} gpu {{gpu}} seconds below",
                    ),
                    (
                        f"increase(rankscope_corridor_breaches_total{{{card}}}[$__rate_interval])",
                        "{{instance}} gpu {{gpu}} crossings",
                    ),
                ],
            ),
            timeseries(
                "Card identity",
                "Total = rank-resident + foreign + free + unattributed. Unattributed is signed "
                "(context, driver, sampling skew) and shown, not hidden.",
                [
                    (
                        f"rankscope_gpu_rank_resident_bytes{{{card}}}",
                        "{{instance}} gpu {{gpu}} rank-resident",
                    ),
                    (f"rankscope_gpu_foreign_bytes{{{card}}}", "{{instance}} gpu {{gpu}} foreign"),
                    (f"rankscope_gpu_free_bytes{{{card}}}", "{{instance}} gpu {{gpu}} free"),
                    (
                        f"rankscope_gpu_unattributed_bytes{{{card}}}",
                        "{{instance}} gpu {{gpu}} unattributed",
                    ),
                ],
                unit="bytes",
                stack=True,
            ),
            table(
                "Holdings per process",
                "Every process NVML lists on the card; role foreign (red) is no rank of any boot.",
                [
                    (
                        f"max by (instance, gpu, uuid, pid, comm, role, boot, rank) "
                        f'(rankscope_gpu_process_bytes{{{card}, boot=~"$boot|"}})',
                        "",
                    )
                ],
                unit="bytes",
                overrides=_foreign_stands_out(),
            ),
            timeseries(
                "Foreign holdings",
                "Memory held by processes that are no rank of any boot, by pid and comm.",
                [
                    (
                        f'rankscope_gpu_process_bytes{{{card}, role="foreign"}}',
                        "{{instance}} gpu {{gpu}} pid {{pid}} {{comm}}",
                    )
                ],
                unit="bytes",
            ),
            timeseries(
                "Out-of-memory instants",
                "OOMs per interval: a rank's allocator failed (boot, rank, pid), or the sampler "
                "saw the card's free memory at or below --oom.free-below (no pid).",
                [
                    (
                        f"increase(rankscope_oom_events_total{{{card}}}[$__rate_interval])",
                        "{{instance}} gpu {{gpu}} rank {{rank}} pid {{pid}}",
                    )
                ],
            ),
            table(
                "Holders at the latest OOM",
                "Every process on the card at its latest OOM instant, largest first; role "
                "foreign (red) is no rank of any boot. `rankscope oom DIR` prints the whole "
                "instant.",
                [
                    (
                        f"sort_desc(max by (instance, gpu, uuid, pid, comm, role, boot, rank) "
                        f"(rankscope_oom_holder_bytes{{{card}}}))",
                        "",
                    )
                ],
                unit="bytes",
                overrides=_foreign_stands_out(),
            ),
            table(
                "Cards",
                "Card identity: model, and whether the device source is NVML or simulated.",
                [
                    (f"rankscope_gpu_info{{{card}}}", ""),
                    (f"rankscope_gpu_total_bytes{{{card}}}", ""),
                ],
                width=24,
            ),
        ],
    )


def boot_ledger(c: Mapping[str, Any]) -> dict:
    s = c["selector"]
    mark = f'{s}, instance=~"$instance", boot=~"$boot", gpu=~"$gpu"'
    arena = f'{s}, instance=~"$instance", boot=~"$boot"'

    def posts(view: str, what: str) -> dict:
        return table(
            f"Posts, {view} view",
            f"Bytes each phase took per rank and card, as {what} sees it (signed).",
            [
                (
                    f'sum by (boot, rank, gpu, post) (rankscope_post_bytes{{{mark}, view="{view}"}})',
                    "",
                )
            ],
            unit="bytes",
            width=8,
        )

    return _dashboard(
        "rankscope-boot-ledger",
        "rankscope / Boot ledger",
        "Where the memory of a boot went: posts per rank and card by phase in the allocator, "
        "driver and process views, the non-torch residue and the KV arenas.",
        [
            _query_variable(
                "instance",
                "Host",
                f"label_values(rankscope_phase_timestamp_seconds{{{s}}}, instance)",
            ),
            _query_variable(
                "boot",
                "Boot",
                f'label_values(rankscope_phase_timestamp_seconds{{{s}, instance=~"$instance"}}, boot)',
            ),
            _query_variable(
                "gpu",
                "Card",
                f'label_values(rankscope_phase_timestamp_seconds{{{s}, instance=~"$instance", boot=~"$boot"}}, gpu)',
            ),
        ],
        [
            posts("allocator", "torch's caching allocator"),
            posts("driver", "the driver (free memory)"),
            posts("process", "NVML's per-process bytes"),
            table(
                "Marks per rank",
                "Allocator reserved and allocated, NVML bytes of the process and driver free "
                "memory at each phase mark.",
                [
                    (f"rankscope_phase_reserved_bytes{{{mark}}}", ""),
                    (f"rankscope_phase_allocated_bytes{{{mark}}}", ""),
                    (f"rankscope_phase_process_bytes{{{mark}}}", ""),
                    (f"rankscope_phase_device_free_bytes{{{mark}}}", ""),
                ],
                unit="bytes",
                width=24,
            ),
            table(
                "Non-torch residue",
                "NVML bytes of the process minus allocator reserved, signed: CUDA context, "
                "NCCL buffers, graph pools. Absent where the subtraction is no measurement.",
                [(f"rankscope_phase_non_torch_bytes{{{mark}}}", "")],
                unit="bytes",
            ),
            table(
                "KV arenas: reserved versus backed",
                "Address space each arena reserved, the part backed by committed pages, parked "
                "handles, and the unbacked reservation (reserved minus backed).",
                [
                    (f"rankscope_arena_reserved_bytes{{{arena}}}", ""),
                    (f"rankscope_arena_backed_bytes{{{arena}}}", ""),
                    (f"rankscope_arena_retained_bytes{{{arena}}}", ""),
                    (
                        f"rankscope_arena_reserved_bytes{{{arena}}} - rankscope_arena_backed_bytes{{{arena}}}",
                        "",
                    ),
                ],
                unit="bytes",
            ),
        ],
    )


def census(c: Mapping[str, Any]) -> dict:
    s = c["selector"]
    rank = f'{s}, instance=~"$instance", boot=~"$boot"'
    op = f'{rank}, group=~"$group"'
    derived = 'boot=~"$boot", group=~"$group"'
    lookback = c["censusSkewLookback"]
    return _dashboard(
        "rankscope-census",
        "rankscope / Census",
        "Collective counts per rank, group instance and op, compared only between ranks at "
        "the same census round; skew, deficits and how fresh each rank's snapshot is.",
        [
            _query_variable(
                "instance",
                "Host",
                f"label_values(rankscope_census_round{{{s}}}, instance)",
                include_all=False,
            ),
            _query_variable(
                "boot",
                "Boot",
                f'label_values(rankscope_census_round{{{s}, instance=~"$instance"}}, boot)',
            ),
            _query_variable(
                "group",
                "Group instance",
                'label_values(rankscope:census_group_round{boot=~"$boot"}, group)',
            ),
        ],
        [
            table(
                "Group instances across hosts",
                "Per group instance: the latest census round a host compared it at, how many "
                "different count digests the hosts at that round publish (1: they agree), and "
                "each rank that was behind the most advanced rank of its host within "
                "RankscopeCensusSkew's lookback, by how many collectives of which op.",
                [
                    (f"rankscope:census_group_round{{{derived}}}", ""),
                    (f"rankscope:census_group_digests{{{derived}}}", ""),
                    (
                        f"max_over_time(rankscope_census_rank_deficit{{{s}, {derived}}}[{lookback}])",
                        "",
                    ),
                ],
                width=24,
            ),
            table(
                "Counts per rank",
                "Each rank's collective counts at its latest snapshot round, per group "
                "instance and op, for the chosen host(s); compare ranks at the same round.",
                [(f"rankscope_census_round_collectives{{{op}}}", "")],
                width=24,
            ),
            timeseries(
                "Hosts that disagree",
                "Different count digests among the hosts at each group instance's latest "
                "round: 1 while they agree, more while some count differs.",
                [(f"rankscope:census_group_digests{{{derived}}}", "{{boot}} {{group}}")],
            ),
            timeseries(
                "In-process divergence",
                "1 where the ranks' own comparison (gloo) found a disagreement.",
                [
                    (
                        f'rankscope_census_divergence{{{rank}, group=~"$group"}}',
                        "{{boot}} {{group}} {{op}}",
                    )
                ],
            ),
            timeseries(
                "Census round per rank",
                "The round of each rank's latest snapshot; ranks of one boot move together.",
                [(f"rankscope_census_round{{{rank}}}", "{{boot}} rank {{rank}}")],
            ),
            timeseries(
                "Snapshot age per rank",
                "Seconds since each rank's latest census snapshot; a rising line is a hang.",
                [
                    (
                        f"time() - rankscope_census_snapshot_timestamp_seconds{{{rank}}}",
                        "{{boot}} rank {{rank}}",
                    )
                ],
                unit="s",
            ),
            timeseries(
                "Collectives per second",
                "Rate of collectives each rank issues per group instance and op.",
                [
                    (
                        f"rate(rankscope_collectives_total{{{op}}}[$__rate_interval])",
                        "rank {{rank}} {{group}} {{op}}",
                    )
                ],
                unit="ops",
                width=24,
            ),
            *_nccl_ras_panels(f'{s}, instance=~"$instance"'),
        ],
    )


def _nccl_ras_panels(host: str) -> list[dict]:
    """NCCL's own view through its RAS endpoints (the nccl-ras collector, off by default:
    these panels stay empty without it). Not filtered by boot: a communicator whose ranks
    match no flight record has no boot (docs/census.md, "NCCL RAS")."""
    comm = "{{endpoint}} {{comm}} {{boot}}"
    return [
        table(
            "NCCL communicators (RAS)",
            "Every communicator a RAS endpoint reported: its size, the ranks that answered "
            "and the ranks that did not; boot and rank where the flight records map them.",
            [
                (f"rankscope_nccl_communicator_size{{{host}}}", ""),
                (f"rankscope_nccl_communicator_ranks_reporting{{{host}}}", ""),
                (f"rankscope_nccl_communicator_ranks_missing{{{host}}}", ""),
            ],
            width=24,
        ),
        timeseries(
            "NCCL mismatches (RAS)",
            "1 where a communicator's ranks stay at different counts (per op) or status "
            "over several polls: what RankscopeNcclCountMismatch pages on.",
            [
                (f"rankscope_nccl_count_mismatch{{{host}}}", comm + " {{op}}"),
                (f"rankscope_nccl_status_mismatch{{{host}}}", comm + " status"),
            ],
        ),
        timeseries(
            "NCCL dead and unreachable peers (RAS)",
            "Processes RAS considers dead (RankscopeNcclPeerDead), and missing ranks by state.",
            [
                (f"rankscope_nccl_dead_processes{{{host}}}", "{{endpoint}} dead processes"),
                (
                    f"sum by (endpoint, state) (rankscope_nccl_rank_missing{{{host}}})",
                    "{{endpoint}} {{state}} ranks",
                ),
            ],
        ),
        timeseries(
            "NCCL collectives per second (RAS)",
            "Rate of collectives each rank launched per communicator and op, as NCCL counts "
            "them (no Send/Recv; one-rank communicators count none).",
            [
                (
                    f"rate(rankscope_nccl_collectives_total{{{host}}}[$__rate_interval])",
                    "{{comm}} rank {{nccl_rank}} {{op}}",
                )
            ],
            unit="ops",
        ),
        timeseries(
            "RAS endpoint polls",
            "1 when the last poll of an endpoint parsed; failed polls per second by reason.",
            [
                (f"rankscope_nccl_ras_up{{{host}}}", "{{endpoint}} up"),
                (
                    f"rate(rankscope_nccl_ras_poll_errors_total{{{host}}}[$__rate_interval])",
                    "{{endpoint}} {{reason}}",
                ),
            ],
        ),
    ]


def instrument(c: Mapping[str, Any]) -> dict:
    s = c["selector"]
    daemon = f'{s}, instance=~"$instance"'
    return _dashboard(
        "rankscope-instrument",
        "rankscope / The instrument",
        "The daemon itself: sources up, sampler cost and overruns, scrape and collector "
        "durations, skipped flight lines.",
        [_query_variable("instance", "Host", f"label_values(rankscope_up{{{s}}}, instance)")],
        [
            timeseries(
                "Sources and target up",
                "rankscope_up per source (nvml, flight) and Prometheus's up for the target.",
                [
                    (f"rankscope_up{{{daemon}}}", "{{instance}} {{source}}"),
                    (f"up{{{daemon}}}", "{{instance}} scrape"),
                ],
            ),
            timeseries(
                "Sampler cost per sample",
                "Mean time one corridor sample takes, all cards together.",
                [
                    (
                        f"rate(rankscope_sampler_duration_seconds_sum{{{daemon}}}[$__rate_interval])"
                        f" / rate(rankscope_sampler_duration_seconds_count{{{daemon}}}[$__rate_interval])",
                        "{{instance}}",
                    )
                ],
                unit="s",
            ),
            timeseries(
                "Sampler rate and overruns",
                "Samples per second, and samples that started late because the previous one "
                "outran the interval.",
                [
                    (
                        f"rate(rankscope_sampler_duration_seconds_count{{{daemon}}}[$__rate_interval])",
                        "{{instance}} samples/s",
                    ),
                    (
                        f"rate(rankscope_sampler_overruns_total{{{daemon}}}[$__rate_interval])",
                        "{{instance}} overruns/s",
                    ),
                ],
            ),
            timeseries(
                "Scrape duration",
                "How long Prometheus takes to scrape the daemon, and each collector's share.",
                [
                    (f"scrape_duration_seconds{{{daemon}}}", "{{instance}} scrape"),
                    (
                        f"rankscope_collector_duration_seconds{{{daemon}}}",
                        "{{instance}} {{collector}}",
                    ),
                ],
                unit="s",
            ),
            timeseries(
                "Collector success",
                "1 when the collector's last scrape succeeded.",
                [(f"rankscope_collector_success{{{daemon}}}", "{{instance}} {{collector}}")],
            ),
            timeseries(
                "Skipped flight lines",
                "Flight-record lines the reader skipped, by reason (torn, malformed, "
                "newer_schema): nothing is lost silently.",
                [
                    (
                        f"increase(rankscope_flight_lines_skipped_total{{{daemon}}}[$__rate_interval])",
                        "{{instance}} {{reason}}",
                    )
                ],
            ),
            table(
                "Versions",
                "The rankscope version each daemon runs.",
                [(f"rankscope_build_info{{{daemon}}}", "")],
                width=24,
            ),
        ],
    )


def build(config: Mapping[str, Any] | None = None) -> dict[str, dict]:
    """File name -> dashboard JSON, for config.DEFAULTS with ``config`` applied."""
    c = merged(config)
    return {
        "rankscope-cards.json": cards(c),
        "rankscope-boot-ledger.json": boot_ledger(c),
        "rankscope-census.json": census(c),
        "rankscope-instrument.json": instrument(c),
    }
