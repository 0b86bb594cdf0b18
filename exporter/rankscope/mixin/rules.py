"""The recording and alerting rules, built from the mixin config.

``build(config)`` returns the rule-file document (``{"groups": [...]}``). Config values are
pasted into expressions and ``for:`` fields as text, so the Helm sync can pass template
references instead of numbers. Alert annotations use Prometheus's own templating only and
never config values, so they survive any renderer unchanged.

Every metric named here is in rankscope.catalog (a test parses the PromQL and checks).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from rankscope.mixin.config import merged

RECORDING_GROUP = "rankscope.rules"
ALERTING_GROUP = "rankscope.alerts"
# The census rules in a group of their own: evaluated concurrently with the others, so their
# cost at fleet scale never delays the corridor rules or the alerts.
CENSUS_GROUP = "rankscope.census"
# The alerts whose `for:` is minutes, in a group evaluated every `slowAlertsInterval`:
# Prometheus expands every label and annotation template of every active alert at every
# evaluation of its group (rules/alerting.go, AlertingRule.Eval), so a condition present on
# every card of a fleet costs its group that much each time, and these need no 15 s
# resolution (docs/benchmarks.md, "Fleet scale").
SLOW_ALERTING_GROUP = "rankscope.alerts.slow"
SLOW_ALERTS = frozenset(
    {
        "RankscopeCorridorThin",
        "RankscopeForeignHolder",
        "RankscopeExporterDown",
        "RankscopeSamplerLagging",
    }
)

# Prometheus's own series that rules and panels may name besides the catalog's.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


def _expr(text: str, **values: Any) -> str:
    """Dedent a PromQL template and fill in the config values as text."""
    return textwrap.dedent(text).strip().format(**{k: str(v) for k, v in values.items()})


def recording_rules(c: Mapping[str, Any]) -> list[dict[str, Any]]:
    s = c["selector"]
    return [
        {
            # Worst instant of the sampler's window against the card's floor; signed.
            "record": "rankscope:corridor_margin_bytes",
            "expr": _expr(
                "rankscope_gpu_free_min_bytes{{{s}}} - rankscope_corridor_floor_bytes{{{s}}}",
                s=s,
            ),
        },
    ]


def census_rules(c: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The census comparison across hosts, on each host's summary of each group instance.

    A fleet holds ranks x (group, op) count series (51,200 at 64 hosts of 8 ranks with 100
    each); any rule that selects them reads them all at every evaluation. So the daemon
    compares the ranks of its own host (at a round all of them reached: exact, never a
    round in flight) and publishes per group instance the round it compared and a digest
    of the counts there (rankscope.catalog): the rules compare those, hosts x groups series
    (1,728 at that scale), and name a rank and op in the alert's description only, a query
    run for the one skewed group while the alert is active.
    """
    s = c["selector"]
    return [
        {
            # The latest round any host reports for the group instance.
            "record": "rankscope:census_group_round",
            "expr": _expr("max by (boot, group) (rankscope_census_group_round{{{s}}})", s=s),
        },
        {
            # How many different digests the hosts at the group's latest round publish: 1
            # where they agree on every count, more where a count differs. Hosts behind
            # (scraped before their ranks reached that round) are compared one scrape later.
            "record": "rankscope:census_group_digests",
            "expr": _expr(
                """
                count by (boot, group) (
                  count_values by (boot, group) ("digest",
                    rankscope_census_group_digest{{{s}}}
                    and
                    (rankscope_census_group_round{{{s}}} == on(boot, group) group_left rankscope:census_group_round)
                  )
                )
                """,
                s=s,
            ),
        },
    ]


# How a description names a card: index, uuid and the daemon that watches it.
_CARD = "{{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"


def _alert(
    name: str,
    severity: str,
    expr: str,
    for_: str,
    summary: str,
    description: str,
    c: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": str(for_),
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": " ".join(description.replace("<card>", _CARD).split()),
            "runbook_url": f"{c['runbookUrl']}#{name.lower()}",
        },
    }


def alerting_rules(c: Mapping[str, Any]) -> list[dict[str, Any]]:
    s = c["selector"]
    card = c["cardLabels"]
    daemon = c["daemonLabels"]
    return [
        _alert(
            "RankscopeCorridorBreach",
            "critical",
            _expr(
                """
                increase(rankscope_corridor_breach_seconds_total{{{s}}}[{w}]) > 0
                or
                increase(rankscope_corridor_breaches_total{{{s}}}[{w}]) > 0
                or
                rankscope:corridor_margin_bytes < 0
                """,
                s=s,
                w=c["corridorBreachWindow"],
            ),
            c["corridorBreachFor"],
            "A card's free memory fell below its corridor floor.",
            """Card <card> spent time below its free-memory floor{{ with printf
            "rankscope_corridor_floor_bytes{instance=%q,uuid=%q}" $labels.instance
            $labels.uuid | query }} of {{ . | first | value | humanize1024 }}B{{ end }} within
            the breach window; the next allocation there may fail with out-of-memory.""",
            c,
        ),
        _alert(
            "RankscopeCorridorThin",
            "warning",
            _expr(
                """
                rankscope:corridor_margin_bytes >= 0
                and
                rankscope:corridor_margin_bytes < {share} * rankscope_corridor_floor_bytes{{{s}}}
                """,
                s=s,
                share=c["corridorThinShare"],
            ),
            c["corridorThinFor"],
            "A card's worst-instant free memory stays close to its corridor floor.",
            """Card <card> has kept only {{ $value | humanize1024 }}B of free memory
            above its floor at its worst instant.""",
            c,
        ),
        _alert(
            "RankscopeCensusSkew",
            "critical",
            _expr(
                """
                max_over_time(rankscope_census_rank_deficit{{{s}}}[{lookback}]) > 0
                or on(boot, group)
                max_over_time(rankscope:census_group_digests[{lookback}]) > 1
                or on(boot, group)
                max by (boot, group, op) (rankscope_census_divergence{{{s}}}) > 0
                """,
                s=s,
                lookback=c["censusSkewLookback"],
            ),
            c["censusSkewFor"],
            "Ranks of one group instance disagree on a collective count at the same round.",
            # Across hosts the alert names the group only; the query naming each rank
            # behind and its op reads the group's count series, and runs only while the
            # alert is active.
            """{{ if $labels.rank }}Rank {{ $labels.rank }} of boot {{ $labels.boot }} is
            {{ $value }} {{ $labels.op }} collective(s) behind the most advanced rank of group
            {{ $labels.group }} on {{ $labels.instance }} at census round {{ with printf
            "rankscope_census_group_round{instance=%q,boot=%q,group=%q}" $labels.instance
            $labels.boot $labels.group | query }}{{ . | first | value }}{{ end }}.{{ else if
            $labels.op }}The in-process comparison of boot {{ $labels.boot }} found the ranks
            of group {{ $labels.group }} disagreeing on {{ $labels.op }}.{{ else }}The hosts
            of group {{ $labels.group }} of boot {{ $labels.boot }} disagree on its collective
            counts at census round {{ with printf
            "rankscope:census_group_round{boot=%q,group=%q}" $labels.boot $labels.group |
            query }}{{ . | first | value }}{{ end }}.{{ range printf
            "max by (op) (rankscope_census_round_collectives{boot=%[1]q,group=%[2]q} and
            on(job, instance, boot, rank) (rankscope_census_round{boot=%[1]q} ==
            scalar(rankscope:census_group_round{boot=%[1]q,group=%[2]q}))) - on(op)
            group_right() (rankscope_census_round_collectives{boot=%[1]q,group=%[2]q} and
            on(job, instance, boot, rank) (rankscope_census_round{boot=%[1]q} ==
            scalar(rankscope:census_group_round{boot=%[1]q,group=%[2]q}))) > 0" $labels.boot
            $labels.group | query }} Rank {{ .Labels.rank }} is {{ .Value }} {{
            .Labels.op }} collective(s) behind the most advanced rank.{{ else }} The ranks
            have moved on since; rankscope census names them.{{ end }}{{ end }} A rank skipped
            or added a collective; the group will hang in its next mismatched collective.""",
            c,
        ),
        _alert(
            "RankscopeCensusStalled",
            "warning",
            _expr(
                """
                time() - rankscope_census_snapshot_timestamp_seconds{{{s}}} > {stall}
                and on(boot)
                count by (boot) (rankscope_gpu_process_bytes{{{s}, role="rank"}})
                """,
                s=s,
                stall=c["censusStallSeconds"],
            ),
            c["censusStalledFor"],
            "A live boot's rank stopped writing census snapshots.",
            """Rank {{ $labels.rank }} of boot {{ $labels.boot }} last wrote a census snapshot
            {{ $value | humanizeDuration }} ago while the boot still holds GPU memory: the rank
            is hung in a collective or wedged.""",
            c,
        ),
        _alert(
            "RankscopeNcclCountMismatch",
            "critical",
            _expr(
                """
                max by ({daemon}, endpoint, comm, comm_secondary, boot, op) (rankscope_nccl_count_mismatch{{{s}}}) == 1
                or
                max by ({daemon}, endpoint, comm, comm_secondary, boot) (rankscope_nccl_status_mismatch{{{s}}}) == 1
                """,
                s=s,
                daemon=daemon,
            ),
            c["ncclCountMismatchFor"],
            "NCCL's RAS shows ranks of one communicator stuck at different counts.",
            """{{ if $labels.op }}The ranks of NCCL communicator {{ $labels.comm }}
            disagree on their {{ $labels.op }} count, and the lagging ranks have not moved
            over several polls{{ else }}The ranks of NCCL communicator {{ $labels.comm }}
            report different status (init, error, finalize or abort){{ end }}, as the RAS
            endpoint {{ $labels.endpoint }} on {{ $labels.instance }} reports it{{ if
            $labels.boot }} (boot {{ $labels.boot }}){{ end }}. The communicator is hung or
            about to hang in a mismatched collective.""",
            c,
        ),
        _alert(
            "RankscopeNcclPeerDead",
            "critical",
            _expr(
                """
                rankscope_nccl_dead_processes{{{s}}} > 0
                """,
                s=s,
            ),
            c["ncclPeerDeadFor"],
            "NCCL's RAS considers a process of the job dead.",
            """The RAS endpoint {{ $labels.endpoint }} on {{ $labels.instance }} reports
            {{ $value }} job process(es) unreachable over the RAS network for 60 s or more
            (considered dead); every communicator they belong to will hang.""",
            c,
        ),
        # The largest foreign holder of each card only, as the daemon publishes it: one
        # alert per card at most, where one per pid made the alert group's evaluation
        # outgrow its interval at fleet scale, and a rule over every process series still
        # cost it 5-8% of it (docs/benchmarks.md).
        _alert(
            "RankscopeForeignHolder",
            "warning",
            _expr(
                """
                (rankscope_gpu_largest_foreign_bytes{{{s}}} > {min_bytes})
                * on({card}) group_left(boot)
                (
                  0 * topk by ({card}) (1, sum by ({card}, boot) (rankscope_gpu_process_bytes{{{s}, role="rank"}}))
                  + 1
                )
                """,
                s=s,
                card=card,
                min_bytes=c["foreignHolderMinBytes"],
            ),
            c["foreignHolderFor"],
            "A process that is no rank holds memory on a card that serves a boot.",
            """Process {{ $labels.pid }} ({{ $labels.comm }}), the largest foreign holder
            there, holds {{ $value | humanize1024 }}B on card <card>, which serves boot
            {{ $labels.boot }}; it is no rank of any boot.""",
            c,
        ),
        _alert(
            "RankscopeOutOfMemory",
            "critical",
            # A counter series is born at its first OOM, which increase() cannot see: a
            # series that exists now and did not a window ago is a new OOM too.
            _expr(
                """
                increase(rankscope_oom_events_total{{{s}}}[{w}]) > 0
                or
                (rankscope_oom_events_total{{{s}}} unless rankscope_oom_events_total{{{s}}} offset {w})
                """,
                s=s,
                w=c["oomWindow"],
            ),
            c["oomFor"],
            "A process ran out of GPU memory, or a card's free memory reached zero.",
            """{{ if $labels.pid }}Rank {{ $labels.rank }} (pid {{ $labels.pid }}) of boot
            {{ $labels.boot }} ran out of memory on card <card>.{{ else }}Card <card> ran out
            of free memory where no allocator reported it (NCCL, an extension's cudaMalloc,
            another process).{{ end }} Holders at that instant:{{ range printf
            "sort_desc(rankscope_oom_holder_bytes{instance=%q,uuid=%q})" $labels.instance
            $labels.uuid | query }} {{ .Labels.pid }} ({{ .Labels.comm }}, {{ .Labels.role
            }}{{ if .Labels.rank }} {{ .Labels.rank }} of boot {{ .Labels.boot }}{{ end }})
            {{ .Value | humanize1024 }}B;{{ end }} see rankscope oom.""",
            c,
        ),
        _alert(
            "RankscopeExporterDown",
            "warning",
            _expr(
                """
                up{{{s}}} == 0
                or
                rankscope_up{{{s}}} == 0
                """,
                s=s,
            ),
            c["exporterDownFor"],
            "The rankscope daemon or one of its sources is down.",
            """{{ if $labels.source }}The {{ $labels.source }} source of the rankscope daemon
            at {{ $labels.instance }} is down.{{ else }}Prometheus cannot scrape the rankscope
            daemon at {{ $labels.instance }}.{{ end }} Corridor, holdings and census metrics
            from there are stale or missing.""",
            c,
        ),
        _alert(
            "RankscopeSamplerLagging",
            "warning",
            _expr(
                """
                increase(rankscope_sampler_overruns_total{{{s}}}[{w}])
                / increase(rankscope_sampler_duration_seconds_count{{{s}}}[{w}])
                > {share}
                or
                increase(rankscope_sampler_duration_seconds_count{{{s}}}[{w}]) == 0
                and on({daemon})
                count by ({daemon}) (rankscope_gpu_total_bytes{{{s}}})
                """,
                s=s,
                w=c["samplerLagWindow"],
                share=c["samplerOverrunShare"],
                daemon=daemon,
            ),
            c["samplerLaggingFor"],
            "The corridor sampler falls behind its interval.",
            """The corridor sampler of the rankscope daemon at {{ $labels.instance }} {{ if eq $value 0.0
            }}took no sample{{ else }}started {{ $value |
            humanizePercentage }} of its samples late{{ end }}: troughs shorter than the
            scrape interval may go unseen.""",
            c,
        ),
    ]


def build(config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rule-file document for ``config`` (overrides of config.DEFAULTS)."""
    c = merged(config)
    alerts = alerting_rules(c)
    return {
        "groups": [
            {"name": RECORDING_GROUP, "rules": recording_rules(c)},
            {"name": CENSUS_GROUP, "rules": census_rules(c)},
            {"name": ALERTING_GROUP, "rules": [r for r in alerts if r["alert"] not in SLOW_ALERTS]},
            {
                "name": SLOW_ALERTING_GROUP,
                "interval": str(c["slowAlertsInterval"]),
                "rules": [r for r in alerts if r["alert"] in SLOW_ALERTS],
            },
        ]
    }


def alert_names() -> list[str]:
    return [r["alert"] for r in alerting_rules(merged())]
