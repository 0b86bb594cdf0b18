"""Who holds a card's memory, and running out of it."""

from rankscope.mixin.alerts import Alert

ALERTS = (
    # The largest foreign holder of each card only, as the daemon publishes it: one alert
    # per card at most, where one per pid made the alert group's evaluation outgrow its
    # interval at fleet scale, and a rule over every process series still cost it 5-8% of
    # it (docs/performance.md).
    Alert(
        "RankscopeForeignHolder",
        "warning",
        expr="""
        (rankscope_gpu_largest_foreign_bytes{{{selector}}} > {foreignHolderMinBytes})
        * on({cardLabels}) group_left(boot)
        (
          0 * topk by ({cardLabels}) (1, sum by ({cardLabels}, boot) (rankscope_gpu_process_bytes{{{selector}, role="rank"}}))
          + 1
        )
        """,
        for_="foreignHolderFor",
        slow=True,
        summary="A process that is no rank holds memory on a card that serves a boot.",
        description="""Process {{ $labels.pid }} ({{ $labels.comm }}), the largest foreign
        holder there, holds {{ $value | humanize1024 }}B on card <card>, which serves boot
        {{ $labels.boot }}; it is no rank of any boot.""",
    ),
    # A counter series is born at its first OOM, which increase() cannot see: a series
    # that exists now and did not a window ago is a new OOM too.
    Alert(
        "RankscopeOutOfMemory",
        "critical",
        expr="""
        increase(rankscope_oom_events_total{{{selector}}}[{oomWindow}]) > 0
        or
        (rankscope_oom_events_total{{{selector}}} unless rankscope_oom_events_total{{{selector}}} offset {oomWindow})
        """,
        for_="oomFor",
        summary="A process ran out of GPU memory, or a card's free memory reached zero.",
        description="""{{ if $labels.pid }}Rank {{ $labels.rank }} (pid {{ $labels.pid }})
        of boot {{ $labels.boot }} ran out of memory on card <card>.{{ else }}Card <card>
        ran out of free memory where no allocator reported it (NCCL, an extension's
        cudaMalloc, another process).{{ end }} Holders at that instant:{{ range printf
        "sort_desc(rankscope_oom_holder_bytes{instance=%q,uuid=%q})" $labels.instance
        $labels.uuid | query }} {{ .Labels.pid }} ({{ .Labels.comm }}, {{ .Labels.role
        }}{{ if .Labels.rank }} {{ .Labels.rank }} of boot {{ .Labels.boot }}{{ end }})
        {{ .Value | humanize1024 }}B;{{ end }} see rankscope oom.""",
    ),
)
