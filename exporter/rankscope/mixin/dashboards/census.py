"""rankscope / Census: collective counts per rank, group instance and op, compared only
between ranks at the same census round; and NCCL's own view through its RAS endpoints."""

from __future__ import annotations

from rankscope.mixin.config import Config
from rankscope.mixin.dashboards import dashboard, rate, table, timeseries, variable


def build(c: Config) -> dict:
    s = c["selector"]
    host = f'{s}, instance=~"$instance"'
    rank = f'{host}, boot=~"$boot"'
    op = f'{rank}, group=~"$group"'
    derived = 'boot=~"$boot", group=~"$group"'
    lookback = c["censusSkewLookback"]
    comm = "{{endpoint}} {{comm}} {{boot}}"
    panels = [
        # Each rank's state and how long its counts have stood still (the hang, named).
        table(
            "Rank states",
            "Each rank's census state (running; stalled: no collective counted for the stall "
            "time; exited; dead: gone without its exit line) and the seconds since its counts "
            "last moved. `rankscope census` and the status page name the collective a stalled "
            "rank is in; RankscopeCensusHang pages when a group stands still at different "
            "counts or has a dead member.",
            f"rankscope_census_rank_state{{{rank}}} == 1",
            f"rankscope_census_since_progress_seconds{{{rank}}}",
            width=24,
        ),
        timeseries(
            "Stalled and dead ranks",
            "Ranks per boot in each state but running: stalled ranks while a job idles between "
            "collectives are normal, stalled ranks that stay are a hang.",
            (
                f'sum by (boot, state) (rankscope_census_rank_state{{{rank}, state!="running"}})',
                "{{boot}} {{state}}",
            ),
        ),
        timeseries(
            "Seconds since progress",
            "Seconds since each rank's collective counts last moved.",
            (f"rankscope_census_since_progress_seconds{{{rank}}}", "{{boot}} rank {{rank}}"),
            unit="s",
        ),
        # The comparison across hosts, per group instance.
        table(
            "Group instances across hosts",
            "Per group instance: the latest census round a host compared it at, how many "
            "different count digests the hosts at that round publish (1: they agree), and "
            "each rank that was behind the most advanced rank of its host within "
            "RankscopeCensusSkew's lookback, by how many collectives of which op.",
            f"rankscope:census_group_round{{{derived}}}",
            f"rankscope:census_group_digests{{{derived}}}",
            f"max_over_time(rankscope_census_rank_deficit{{{s}, {derived}}}[{lookback}])",
            width=24,
        ),
        table(
            "Counts per rank",
            "Each rank's collective counts at its latest snapshot round, per group "
            "instance and op, for the chosen host(s); compare ranks at the same round.",
            f"rankscope_census_round_collectives{{{op}}}",
            width=24,
        ),
        timeseries(
            "Hosts that disagree",
            "Different count digests among the hosts at each group instance's latest "
            "round: 1 while they agree, more while some count differs.",
            (f"rankscope:census_group_digests{{{derived}}}", "{{boot}} {{group}}"),
        ),
        # Each rank's own census: divergence, round, snapshot age and collective rate.
        timeseries(
            "In-process divergence",
            "1 where the ranks' own comparison (gloo) found a disagreement.",
            (f"rankscope_census_divergence{{{op}}}", "{{boot}} {{group}} {{op}}"),
        ),
        timeseries(
            "Census round per rank",
            "The round of each rank's latest snapshot; ranks of one boot move together.",
            (f"rankscope_census_round{{{rank}}}", "{{boot}} rank {{rank}}"),
        ),
        timeseries(
            "Snapshot age per rank",
            "Seconds since each rank's latest census snapshot; a rising line is a hang.",
            (
                f"time() - rankscope_census_snapshot_timestamp_seconds{{{rank}}}",
                "{{boot}} rank {{rank}}",
            ),
            unit="s",
        ),
        timeseries(
            "Collectives per second",
            "Rate of collectives each rank issues per group instance and op.",
            (rate("rankscope_collectives_total", op), "rank {{rank}} {{group}} {{op}}"),
            unit="ops",
            width=24,
        ),
        # NCCL's own view through its RAS endpoints (the nccl-ras collector, off by default:
        # these panels stay empty without it). Not filtered by boot: a communicator whose
        # ranks match no flight record has no boot (docs/census.md, "NCCL RAS").
        table(
            "NCCL communicators (RAS)",
            "Every communicator a RAS endpoint reported: its size, the ranks that answered "
            "and the ranks that did not; boot and rank where the flight records map them.",
            f"rankscope_nccl_communicator_size{{{host}}}",
            f"rankscope_nccl_communicator_ranks_reporting{{{host}}}",
            f"rankscope_nccl_communicator_ranks_missing{{{host}}}",
            width=24,
        ),
        timeseries(
            "NCCL mismatches (RAS)",
            "1 where a communicator's ranks stay at different counts (per op) or status "
            "over several polls: what RankscopeNcclCountMismatch pages on.",
            (f"rankscope_nccl_count_mismatch{{{host}}}", comm + " {{op}}"),
            (f"rankscope_nccl_status_mismatch{{{host}}}", comm + " status"),
        ),
        timeseries(
            "NCCL dead and unreachable peers (RAS)",
            "Processes RAS considers dead (RankscopeNcclPeerDead), and missing ranks by state.",
            (f"rankscope_nccl_dead_processes{{{host}}}", "{{endpoint}} dead processes"),
            (
                f"sum by (endpoint, state) (rankscope_nccl_rank_missing{{{host}}})",
                "{{endpoint}} {{state}} ranks",
            ),
        ),
        timeseries(
            "NCCL collectives per second (RAS)",
            "Rate of collectives each rank launched per communicator and op, as NCCL counts "
            "them (no Send/Recv; one-rank communicators count none).",
            (
                rate("rankscope_nccl_collectives_total", host),
                "{{comm}} rank {{nccl_rank}} {{op}}",
            ),
            unit="ops",
        ),
        timeseries(
            "RAS endpoint polls",
            "1 when the last poll of an endpoint parsed; failed polls per second by reason.",
            (f"rankscope_nccl_ras_up{{{host}}}", "{{endpoint}} up"),
            (rate("rankscope_nccl_ras_poll_errors_total", host), "{{endpoint}} {{reason}}"),
        ),
    ]
    return dashboard(
        "rankscope-census",
        "rankscope / Census",
        "Collective counts per rank, group instance and op, compared only between ranks at "
        "the same census round; skew, deficits and how fresh each rank's snapshot is.",
        [
            variable("instance", "Host", f"rankscope_census_rank_state{{{s}}}", include_all=False),
            variable("boot", "Boot", f"rankscope_census_rank_state{{{host}}}"),
            variable("group", "Group instance", 'rankscope:census_group_round{boot=~"$boot"}'),
        ],
        panels,
    )
