"""The census: ranks of one group instance disagreeing on a collective count, hung, or stalled.

Rules over the ranks x (group, op) count series would read 51,200 of them at 64 hosts of 8
ranks at every evaluation. So each daemon publishes per group instance its host's latest
common round and a digest of the counts there; the rules compare those, and only an active
alert's description queries the counts of the one skewed group to name a rank and op.
"""

from rankscope.mixin.alerts import Alert

RECORDING = {
    # The latest round any host reports for the group instance.
    "rankscope:census_group_round": "max by (boot, group) (rankscope_census_group_round{{{selector}}})",
    # How many different digests the hosts at the group's latest round publish: 1 where
    # they agree on every count, more where a count differs. Hosts behind (scraped before
    # their ranks reached that round) are compared one scrape later.
    "rankscope:census_group_digests": """
        count by (boot, group) (
          count_values by (boot, group) ("digest",
            rankscope_census_group_digest{{{selector}}}
            and
            (rankscope_census_group_round{{{selector}}} == on(boot, group) group_left rankscope:census_group_round)
          )
        )
        """,
}


ALERTS = (
    Alert(
        "RankscopeCensusHang",
        "critical",
        expr="""
        max by (job, instance, boot, rank, group, op) (rankscope_census_latest_deficit{{{selector}}}) > 0
        and on(boot)
        count by (boot) (rankscope_census_rank_state{{{selector}, state="stalled"}} == 1)
        or
        max by (job, instance, boot, rank) (rankscope_census_rank_state{{{selector}, state="dead"}}) == 1
        """,
        for_="censusHangFor",
        summary="A group's ranks stand still at different collective counts, or a rank is dead.",
        description="""{{ if $labels.op }}Rank {{ $labels.rank }} of boot {{ $labels.boot }} stands
        {{ $value }} {{ $labels.op }} collective(s) behind the most advanced rank of group
        {{ $labels.group }} on {{ $labels.instance }}, and no rank of the group is moving: the job
        is hung in a mismatched collective.{{ range printf
        "rankscope_census_blocked_collective{instance=%q,boot=%q}" $labels.instance $labels.boot |
        query }} Rank {{ .Labels.rank }} is in {{ .Labels.group }} {{ .Labels.op }} #{{ .Value
        }}.{{ end }}{{ else }}Rank {{ $labels.rank }} of boot {{ $labels.boot }} on {{
        $labels.instance }} is dead: its process is gone without its exit line, and its peers
        will hang in their next collective with it.{{ end }} rankscope census names every rank's
        state.""",
    ),
    # Across hosts the skew alert names the group only; the query naming each rank behind and
    # its op reads the group's count series, and runs only while the alert is active.
    Alert(
        "RankscopeCensusSkew",
        "critical",
        expr="""
        max_over_time(rankscope_census_rank_deficit{{{selector}}}[{censusSkewLookback}]) > 0
        or on(boot, group)
        max_over_time(rankscope_census_latest_deficit{{{selector}}}[{censusSkewLookback}]) > 0
        or on(boot, group)
        max_over_time(rankscope:census_group_digests[{censusSkewLookback}]) > 1
        or on(boot, group)
        max by (boot, group, op) (rankscope_census_divergence{{{selector}}}) > 0
        """,
        for_="censusSkewFor",
        summary="Ranks of one group instance disagree on a collective count at the same round.",
        description="""{{ if $labels.rank }}Rank {{ $labels.rank }} of boot {{ $labels.boot }} is
        {{ $value }} {{ $labels.op }} collective(s) behind the most advanced rank of group
        {{ $labels.group }} on {{ $labels.instance }}{{ with printf
        "rankscope_census_group_round{instance=%q,boot=%q,group=%q}" $labels.instance
        $labels.boot $labels.group | query }} at census round {{ . | first | value }}{{ else }}
        at their latest counts{{ end }}.{{ else if
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
    ),
    Alert(
        "RankscopeCensusStalled",
        "warning",
        expr="""
        time() - rankscope_census_snapshot_timestamp_seconds{{{selector}}} > {censusStallSeconds}
        and on(boot)
        count by (boot) (rankscope_gpu_process_bytes{{{selector}, role="rank"}})
        """,
        for_="censusStalledFor",
        summary="A live boot's rank stopped writing census snapshots.",
        description="""Rank {{ $labels.rank }} of boot {{ $labels.boot }} last wrote a census
        snapshot {{ $value | humanizeDuration }} ago while the boot still holds GPU memory:
        the rank is hung in a collective or wedged.""",
    ),
)
