"""rankscope / The instrument: the daemon itself, its sources, sampler and scrapes."""

from __future__ import annotations

from rankscope.mixin.config import Config
from rankscope.mixin.dashboards import dashboard, increase, rate, table, timeseries, variable


def build(c: Config) -> dict:
    s = c["selector"]
    daemon = f'{s}, instance=~"$instance"'
    samples = "rankscope_sampler_duration_seconds_count"
    return dashboard(
        "rankscope-instrument",
        "rankscope / The instrument",
        "The daemon itself: sources up, sampler cost and overruns, scrape and collector "
        "durations, skipped flight lines.",
        [variable("instance", "Host", f"rankscope_up{{{s}}}")],
        [
            timeseries(
                "Sources and target up",
                "rankscope_up per source (nvml, flight) and Prometheus's up for the target.",
                (f"rankscope_up{{{daemon}}}", "{{instance}} {{source}}"),
                (f"up{{{daemon}}}", "{{instance}} scrape"),
            ),
            timeseries(
                "Sampler cost per sample",
                "Mean time one corridor sample takes, all cards together.",
                (
                    f"{rate('rankscope_sampler_duration_seconds_sum', daemon)}"
                    f" / {rate(samples, daemon)}",
                    "{{instance}}",
                ),
                unit="s",
            ),
            timeseries(
                "Sampler rate and overruns",
                "Samples per second, and samples that started late because the previous one "
                "outran the interval.",
                (rate(samples, daemon), "{{instance}} samples/s"),
                (rate("rankscope_sampler_overruns_total", daemon), "{{instance}} overruns/s"),
            ),
            timeseries(
                "Scrape duration",
                "How long Prometheus takes to scrape the daemon, and each collector's share.",
                (f"scrape_duration_seconds{{{daemon}}}", "{{instance}} scrape"),
                (
                    f"rankscope_collector_duration_seconds{{{daemon}}}",
                    "{{instance}} {{collector}}",
                ),
                unit="s",
            ),
            timeseries(
                "Collector success",
                "1 when the collector's last scrape succeeded.",
                (f"rankscope_collector_success{{{daemon}}}", "{{instance}} {{collector}}"),
            ),
            timeseries(
                "Skipped flight lines",
                "Flight-record lines the reader skipped, by reason (torn, malformed, "
                "newer_schema): nothing is lost silently.",
                (
                    increase("rankscope_flight_lines_skipped_total", daemon),
                    "{{instance}} {{reason}}",
                ),
            ),
            table(
                "Versions",
                "The rankscope version each daemon runs.",
                f"rankscope_build_info{{{daemon}}}",
                width=24,
            ),
        ],
    )
