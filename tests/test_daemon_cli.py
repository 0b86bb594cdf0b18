"""`rankscope serve` assembled in-process from its flags: the collector switches, which
collector exposes what (as the catalog says), the docs table, the landing page."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from rankscope import catalog
from rankscope.daemon import cli
from rankscope.daemon.app import LINKS, Daemon, create_app, landing_page, with_links
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import TimedCollectors
from test_daemon_flightstate import census, mark, rank_recorder

REPO = Path(__file__).resolve().parent.parent


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure_parser(parser, "serve")
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:19400", ("127.0.0.1", 19400)),
        (":9", ("0.0.0.0", 9)),
        ("[::1]:8080", ("::1", 8080)),
    ],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert cli.parse_listen_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [("19400", "HOST:PORT"), ("h:x", "not a number"), ("h:70000", "out of range")],
)
def test_bad_listen_addresses_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cli.parse_listen_address(text)


def test_defaults_are_loopback_on_the_documented_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANKSCOPE_DIR", raising=False)
    args = parse()
    assert args.listen_address == "127.0.0.1:19400"
    assert args.phase_boots == 1
    with pytest.raises(ValueError, match="no flight directory"):
        cli.build(args)
    assert "19400" in (REPO / "docs/daemon.md").read_text()


def test_a_flight_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(NotADirectoryError):
        cli.build(parse(f"--flight-dir={f}"))


def _flight(flight_dir: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 0, pid=os.getpid())
    arenas = {"kv": {"reserved": 1, "backed": 1, "retained": 0, "why": None}}
    rec.write("marks", "mark", mark("pre_weight_load", arenas=arenas))
    rec.write("marks", "mark", mark("weights_loaded", arenas=arenas))
    rec.write("census", "census", census(1, [["tp:0-1", "all_reduce", 3]]))
    rec.write(
        "census",
        "divergence",
        {
            "round": 1,
            "group": "tp:0-1",
            "op": "all_reduce",
            "counts": {"0": 3, "1": 2},
            "lagging": [1],
        },
    )


def _families(daemon: Daemon) -> dict[str, set[str]]:
    """collector name -> the families it exposes."""
    return {c.name: {f.name for f in c.collect()} for c in daemon.collectors.collectors}


def test_each_collector_exposes_what_the_catalog_assigns_it(
    flight_dir: Path, tmp_path: Path
) -> None:
    _flight(flight_dir)
    script = tmp_path / "cards.json"
    script.write_text(
        json.dumps(
            {"cards": [{"total": "8GiB", "free": "1GiB", "processes": {str(os.getpid()): "1GiB"}}]}
        )
    )
    daemon = cli.build(
        parse(
            f"--flight-dir={flight_dir}",
            f"--device.script={script}",
            "--corridor.floor=2GiB",
            "--holdings.interval=50ms",
        )
    )
    assert daemon.monitor is not None
    daemon.monitor.start()
    try:
        deadline = time.monotonic() + 10
        while "rankscope_gpu_process_bytes" not in _families(daemon).get("holdings", set()):
            assert time.monotonic() < deadline, "the holdings never reported"
            time.sleep(0.05)
        families = _families(daemon)
    finally:
        daemon.monitor.stop()
    assert set(families) == {"self", "phases", "arenas", "census", "cards", "holdings"}
    # The registry itself adds the per-collector success and duration, as "self".
    families["self"] |= {"rankscope_collector_success", "rankscope_collector_duration_seconds"}
    for m in catalog.CATALOG:
        owners = {name for name, fams in families.items() if m.family in fams}
        assert owners == {m.collector}, (m.name, owners)


def test_collector_switches_turn_collectors_off(flight_dir: Path) -> None:
    _flight(flight_dir)
    daemon = cli.build(
        parse(
            f"--flight-dir={flight_dir}",
            "--no-collector.census",
            "--no-collector.cards",
            "--no-collector.holdings",
        )
    )
    assert daemon.monitor is None
    assert {c.name for c in daemon.collectors.collectors} == {"self", "phases", "arenas"}
    text = TestClient(daemon.app).get("/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "rankscope_phase_reserved_bytes" in names
    assert "rankscope_collectives" not in names
    assert {"rankscope_census_round", "rankscope_census_divergence"}.isdisjoint(names)


def test_the_docs_table_is_generated_from_the_catalog() -> None:
    assert (REPO / "docs/metrics.md").read_text() == catalog.metrics_markdown()
    for m in catalog.CATALOG:
        assert f"| `{m.name}` | {m.type} |" in catalog.metrics_markdown()


def test_catalog_names_follow_prometheus_conventions() -> None:
    assert len({m.name for m in catalog.CATALOG}) == len(catalog.CATALOG)
    for m in catalog.CATALOG:
        assert m.name.startswith("rankscope_"), m.name
        assert (m.type == "counter") == m.name.endswith("_total"), m.name
        if m.unit:
            assert m.family.endswith("_" + m.unit), m.name
        assert "le" not in m.labels and "quantile" not in m.labels
        assert m.help.endswith("."), m.name


def test_the_landing_page_links_every_endpoint(flight_dir: Path, tmp_path: Path) -> None:
    state = FlightState(flight_dir)
    registry = TimedCollectors().registry()
    bare = TestClient(create_app(registry=registry, state=state, static_dir=tmp_path / "none"))
    page = bare.get("/").text
    assert page == landing_page()
    for href, _what in LINKS:
        assert f'href="{href.lstrip("/")}"' in page
    assert bare.get("/api/v1/cards").json()["cards"] == []
    assert (
        bare.get("/api/v1/census").status_code == 501
        or bare.get("/api/v1/census").status_code == 200
    )
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text('<html><body><a href="metrics">m</a></body></html>')
    (static / "app.js").write_text("// status page")
    client = TestClient(create_app(registry=registry, state=state, static_dir=static))
    served = client.get("/").text
    assert served == with_links((static / "index.html").read_text())
    assert served.count('href="metrics"') == 1  # present already: not added again
    for href, _what in LINKS:
        assert f'href="{href.lstrip("/")}"' in served
    assert client.get("/static/app.js").text == "// status page"
