"""The instrument itself: the daemon, its sources and its corridor sampler."""

from rankscope.mixin.alerts import Alert

ALERTS = (
    Alert(
        "RankscopeExporterDown",
        "warning",
        expr="""
        up{{{selector}}} == 0
        or
        rankscope_up{{{selector}}} == 0
        """,
        for_="exporterDownFor",
        slow=True,
        summary="The rankscope daemon or one of its sources is down.",
        description="""{{ if $labels.source }}The {{ $labels.source }} source of the
        rankscope daemon at {{ $labels.instance }} is down.{{ else }}Prometheus cannot
        scrape the rankscope daemon at {{ $labels.instance }}.{{ end }} Corridor, holdings
        and census metrics from there are stale or missing.""",
    ),
    Alert(
        "RankscopeSamplerLagging",
        "warning",
        expr="""
        increase(rankscope_sampler_overruns_total{{{selector}}}[{samplerLagWindow}])
        / increase(rankscope_sampler_duration_seconds_count{{{selector}}}[{samplerLagWindow}])
        > {samplerOverrunShare}
        or
        increase(rankscope_sampler_duration_seconds_count{{{selector}}}[{samplerLagWindow}]) == 0
        and on({daemonLabels})
        count by ({daemonLabels}) (rankscope_gpu_total_bytes{{{selector}}})
        """,
        for_="samplerLaggingFor",
        slow=True,
        summary="The corridor sampler falls behind its interval.",
        description="""The corridor sampler of the rankscope daemon at {{ $labels.instance }}
        {{ if eq $value 0.0 }}took no sample{{ else }}started {{ $value |
        humanizePercentage }} of its samples late{{ end }}: troughs shorter than the scrape
        interval may go unseen.""",
    ),
)
