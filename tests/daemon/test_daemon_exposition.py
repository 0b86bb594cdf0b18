"""/metrics as served over loopback, held to client_python's own exposition: the format each
Accept header gets, byte for byte for every kind of family and for the daemon's real
registry, gzip when asked, a bad version answered rather than a 500, and the catalog's names
legal without any escaping."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import exposition as client
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
    UntypedMetricFamily,
)
from prometheus_client.registry import CollectorRegistry
from tests.daemon.test_daemon_flightstate import census, mark, rank_recorder

from rankscope import catalog
from rankscope.daemon import cli
from rankscope.daemon.app import create_app
from rankscope.daemon.flightstate import FlightState
from rankscope.record import MarkArena

ServeApp = Callable[[Any], Any]  # the conftest fixture serve_app
TEXT_TYPE = client.choose_encoder("")[1]  # the text format, with no Accept header


class Fixed:
    """A collector that yields the same families at each scrape."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def every_kind() -> CollectorRegistry:
    """One family of each kind client_python builds, with the values and label values that
    need care: escapes, non-ASCII, NaN, infinities, Go's exponent form, timestamps."""
    gauge = GaugeMetricFamily("g_bytes", 'help \\ with "quotes"\nand a newline', labels=["b", "a"])
    gauge.add_metric(['quote " backslash \\ newline \n', "ünïcode ✓"], 1.5)
    gauge.add_metric(["nan", ""], float("nan"), timestamp=1234.5678)
    gauge.add_metric(["inf", "-"], float("inf"))
    gauge.add_metric(["-inf", "-"], float("-inf"))
    gauge.add_metric(["big", "-"], 123456789012.0)
    gauge.add_metric(["small", "-"], 1e-9)
    bare = GaugeMetricFamily("bare", "no labels", value=-0.0)
    counter = CounterMetricFamily("c", "a counter", labels=["k"])
    counter.add_metric(["v"], 3, created=1700000000.25)
    counter.add_metric(["w"], 4)
    summary = SummaryMetricFamily("s_seconds", "a summary", labels=["k"])
    summary.add_metric(["v"], count_value=2, sum_value=0.25)
    histogram = HistogramMetricFamily("h", "a histogram", labels=["k"])
    histogram.add_metric(["v"], [("0.5", 1), ("+Inf", 3)], sum_value=2.5)
    information = InfoMetricFamily("build", "an info", labels=["k"])
    information.add_metric(["v"], {"version": "1.2.3"})
    stateset = StateSetMetricFamily("state", "a state set", labels=["k"])
    stateset.add_metric(["v"], {"up": True, "down": False})
    gauge_histogram = GaugeHistogramMetricFamily("gh", "a gauge histogram", labels=["k"])
    gauge_histogram.add_metric(["v"], [("1", 2), ("+Inf", 4)], gsum_value=5)
    unknown = UnknownMetricFamily("u", "unknown", labels=["k"])
    unknown.add_metric(["v"], 7)
    untyped = UntypedMetricFamily("t", "untyped", value=8)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(gauge, bare, counter, summary, histogram, information, stateset))
    registry.register(Fixed(gauge_histogram, unknown, untyped))
    return registry


def metrics_client(registry: CollectorRegistry, flight_dir: Path, serve_app: ServeApp) -> Any:
    state = FlightState(flight_dir)
    app = create_app(
        registry=registry,
        state=state,
    )
    return serve_app(app)


def daemon_registry(flight_dir: Path, tmp_path: Path) -> CollectorRegistry:
    """The registry of a daemon built from its flags over a flight directory with marks,
    arenas, a census and a divergence, with one simulated card held by this process."""
    rec = rank_recorder(flight_dir, "boot-1", 0, pid=os.getpid())
    arenas = {"kv": MarkArena(reserved=1, backed=1, retained=0)}
    rec.write_record(mark("pre_weight_load", arenas=arenas))
    rec.write_record(census(1, [["tp:0-1", "all_reduce", 3]]))
    script = tmp_path / "cards.json"
    card = {"total": "8GiB", "free": "1GiB", "processes": {str(os.getpid()): "1GiB"}}
    script.write_text(json.dumps({"cards": [card]}))
    parser = __import__("argparse").ArgumentParser()
    cli.configure_parser(parser, "serve")
    args = parser.parse_args([f"--flight-dir={flight_dir}", f"--device.script={script}"])
    return cli.build(args).collectors.registry()


def test_the_daemons_own_registry_is_served_as_client_python_encodes_it(
    flight_dir: Path, tmp_path: Path, serve_app: ServeApp
) -> None:
    registry = daemon_registry(flight_dir, tmp_path)
    served = metrics_client(registry, flight_dir, serve_app).get("/metrics")
    assert served.headers["content-type"] == TEXT_TYPE
    ours = served.content
    assert b"rankscope_phase_reserved_bytes{" in ours and b"rankscope_collectives_total{" in ours
    # Two scrapes of a live registry differ in values that move with time (durations, time
    # since progress): the families, series and their order are the same.
    assert series(ours) == series(client.generate_latest(registry))


def series(exposition: bytes) -> list[bytes]:
    """Each line without its value: comments whole, samples as name and labels."""
    return [
        line if line.startswith(b"#") else line.rsplit(b" ", 1)[0]
        for line in exposition.splitlines()
    ]


PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


ACCEPTS = [
    "",
    "*/*",
    "application/json",
    "text/plain",
    "text/plain; version=0.0.4",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0;escaping=dots",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text; version=0.0.1",
    "application/openmetrics-text;version=0.0.1,application/openmetrics-text;version=1.0.0",
    PROMETHEUS_3,
    PROMETHEUS_2,
]


def test_each_accept_header_gets_the_format_client_python_chooses(
    flight_dir: Path, serve_app: ServeApp
) -> None:
    registry = every_kind()
    http = metrics_client(registry, flight_dir, serve_app)
    for accept in ACCEPTS:
        served = http.get("/metrics", headers={"Accept": accept})
        theirs, their_type = client.choose_encoder(accept)
        assert served.status_code == 200 and served.headers["content-type"] == their_type, accept
        assert served.content == theirs(registry), accept
        assert served.headers["vary"] == "Accept, Accept-Encoding"
    assert b"_created" in served.content and b"\\n" in served.content  # the cases are there


def test_gzip_when_the_client_takes_it(flight_dir: Path, serve_app: ServeApp) -> None:
    registry = every_kind()
    http = metrics_client(registry, flight_dir, serve_app)
    plain = http.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    zipped = http.get("/metrics", headers={"Accept-Encoding": "br, gzip;q=0.8"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert int(zipped.headers["content-length"]) < len(plain.content)
    assert zipped.content == plain.content == client.generate_latest(registry)  # httpx unzips


def test_a_version_that_is_not_a_number_gets_the_text_format(
    flight_dir: Path, serve_app: ServeApp
) -> None:
    # client_python's choose_encoder raises here (a 500 from its own server).
    http = metrics_client(every_kind(), flight_dir, serve_app)
    served = http.get("/metrics", headers={"Accept": "application/openmetrics-text; version=junk"})
    assert served.status_code == 200 and served.headers["content-type"] == TEXT_TYPE


LEGACY_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def test_every_catalog_name_is_legal_without_escaping() -> None:
    for m in catalog.CATALOG:
        for name in catalog.exposed_names(m):
            assert LEGACY_METRIC.fullmatch(name), name
        for label in m.labels:
            assert LEGACY_LABEL.fullmatch(label) and not label.startswith("__"), (m.name, label)
