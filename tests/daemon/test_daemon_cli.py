"""`rankscope serve` assembled in-process from its flags: the collector switches, which
collector exposes what (as the catalog says), the docs table, the landing page."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_flightstate import GiB, census, mark, rank_recorder

from rankscope import catalog
from rankscope.daemon import app as app_module
from rankscope.daemon import cli, flightstate
from rankscope.daemon.app import LINKS, create_app, landing_page, with_links
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import TimedCollectors
from rankscope.daemon.server import Daemon
from rankscope.procfs import read_nspid, read_pidns_inode, read_start_ticks
from rankscope.rank.writer import ProcessIdentity, RankIdentity, Recorder
from rankscope.record import Divergence, MarkArena, MarkNvml
from rankscope.record.reader import read_flight
from rankscope.reports.census import census_document
from rankscope.reports.ledger import phases_document

REPO = Path(__file__).resolve().parents[2]
ServeApp = Callable[[Any], httpx.Client]  # the conftest fixture serve_app


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


def test_a_read_budget_of_nothing_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--flight.read-budget=0")
    assert "must be a positive number of bytes" in capsys.readouterr().err


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
    arenas = {"kv": MarkArena(reserved=1, backed=1, retained=0)}
    rec.write_record(mark("pre_weight_load", arenas=arenas))
    rec.write_record(mark("weights_loaded", arenas=arenas))
    rec.write_record(census(1, [["tp:0-1", "all_reduce", 3]]))
    rec.write_record(
        Divergence(round=1, group="tp:0-1", op="all_reduce", counts={0: 3, 1: 2}, lagging=(1,))
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
            "--collector.nccl-ras",  # built, never started: its families are empty
        )
    )
    assert daemon.sources.card_sampler is not None
    daemon.sources.start()
    try:
        deadline = time.monotonic() + 10
        while "rankscope_gpu_process_bytes" not in _families(daemon).get("holdings", set()):
            assert time.monotonic() < deadline, "the holdings never reported"
            time.sleep(0.05)
        families = _families(daemon)
    finally:
        daemon.sources.stop()
    assert set(families) == {
        "self",
        "phases",
        "arenas",
        "census",
        "cards",
        "holdings",
        "oom",
        "nccl-ras",
    }
    # The registry itself adds the per-collector success and duration, as "self".
    families["self"] |= {"rankscope_collector_success", "rankscope_collector_duration_seconds"}
    for m in catalog.CATALOG:
        owners = {name for name, fams in families.items() if m.family in fams}
        assert owners == {m.collector}, (m.name, owners)


def test_collector_switches_turn_collectors_off(flight_dir: Path, serve_app: ServeApp) -> None:
    _flight(flight_dir)
    daemon = cli.build(
        parse(
            f"--flight-dir={flight_dir}",
            "--no-collector.census",
            "--no-collector.cards",
            "--no-collector.holdings",
            "--no-collector.oom",
        )
    )
    assert daemon.sources.card_sampler is None and daemon.sources.oom_book is None
    assert {c.name for c in daemon.collectors.collectors} == {"self", "phases", "arenas"}
    text = serve_app(daemon.app).get("/metrics").text
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
        # process_start_time_seconds keeps client_python's standard name: a restart shows
        # where every exporter's does.
        assert m.name.startswith("rankscope_") or m.name == "process_start_time_seconds", m.name
        assert (m.type == "counter") == m.name.endswith("_total"), m.name
        if m.unit:
            assert m.family.endswith("_" + m.unit), m.name
        assert "le" not in m.labels and "quantile" not in m.labels
        assert m.help.endswith("."), m.name


def test_the_landing_page_links_every_endpoint(
    flight_dir: Path, tmp_path: Path, serve_app: ServeApp
) -> None:
    state = FlightState(flight_dir)
    registry = TimedCollectors().registry()
    bare = serve_app(
        create_app(
            registry=registry,
            state=state,
            static_dir=tmp_path / "none",
        )
    )
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
    client = serve_app(
        create_app(
            registry=registry,
            state=state,
            static_dir=static,
        )
    )
    served = client.get("/").text
    assert served == with_links((static / "index.html").read_text())
    assert served.count('href="metrics"') == 1  # present already: not added again
    for href, _what in LINKS:
        assert f'href="{href.lstrip("/")}"' in served
    assert client.get("/static/app.js").text == "// status page"


def test_readiness_says_why_it_is_not_ready(tmp_path: Path, serve_app: ServeApp) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    app = create_app(
        registry=TimedCollectors().registry(),
        state=FlightState(not_a_dir),
    )
    client = serve_app(app)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert str(not_a_dir) in response.json()["problems"][0]
    assert client.get("/healthz").status_code == 200
    later = FlightState(tmp_path / "not-yet")
    ok = serve_app(
        create_app(
            registry=TimedCollectors().registry(),
            state=later,
        )
    )
    # A directory no job has made yet: not ready (a mistyped path shows), the API answers.
    not_yet = ok.get("/readyz")
    assert not_yet.status_code == 503
    missing = f"flight directory {tmp_path / 'not-yet'}: no such directory"
    assert not_yet.json()["problems"] == [missing]
    assert ok.get("/api/v1/boots").json() == {"boots": []}
    (tmp_path / "not-yet").mkdir()
    later.refresh()  # as the daemon's refresher does
    assert ok.get("/readyz").json() == {
        "ready": True,
        "problems": [],
        "flight": {"files": 0, "unreadable": 0},
    }


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_the_phases_api_counts_a_rank_in_another_pid_namespace_as_a_rank(
    flight_dir: Path, serve_app: ServeApp
) -> None:
    """A real process in its own PID namespace (unshare --pid), seen by NVML under its host
    pid: the daemon finds it through /proc, so the card's identity counts its bytes as
    rank-resident, where the records alone (the CLI) could only call them foreign."""
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while not _children(outer.pid):
            assert time.monotonic() < deadline, "unshare never started its child"
            time.sleep(0.02)
        (host_pid,) = _children(outer.pid)
        nspid = read_nspid(host_pid)
        assert nspid is not None and nspid[-1] == 1  # pid 1 in its own namespace
        identity = ProcessIdentity(
            host="container", pid=1, start_ticks=read_start_ticks(host_pid), nspid=(1,),
            pidns=read_pidns_inode(host_pid),
        )  # fmt: skip
        rec = Recorder(
            flight_dir=flight_dir, rank=RankIdentity(rank=0), process=identity, boot="ns-boot"
        )
        procs: dict[int, int | None] = {host_pid: 3 * GiB, 4194000: 1 * GiB}
        payload = dataclasses.replace(mark("weights_loaded"), nvml=MarkNvml(procs=procs))
        rec.write_record(payload)
        daemon = cli.build(
            parse(f"--flight-dir={flight_dir}", "--no-collector.cards", "--no-collector.holdings")
        )
        (card,) = serve_app(daemon.app).get("/api/v1/phases").json()["cards"]
        (identity_row,) = card["identities"]
        assert identity_row["rank_resident"] == 3 * GiB
        assert identity_row["foreign"] == 1 * GiB
        (cli_card,) = phases_document(read_flight(flight_dir))["cards"]
        assert cli_card["identities"][0]["rank_resident"] == 0  # the records alone cannot tell
    finally:
        outer.kill()
        outer.wait()


def app_as_served(state: FlightState) -> FastAPI:
    """The API over ``state`` with the reports `rankscope serve` gives it, no collectors."""
    return create_app(
        registry=TimedCollectors().registry(),
        state=state,
    )


def test_the_api_answers_from_the_tailed_state_without_rereading_per_request(
    flight_dir: Path, monkeypatch: pytest.MonkeyPatch, serve_app: ServeApp
) -> None:
    rec = rank_recorder(flight_dir, "boot-1", 0)
    rec.write_record(mark("pre_weight_load"))
    rec.write_record(mark("weights_loaded"))
    rec.write_record(census(1, [["tp:0-1", "all_reduce", 3]]))
    state = FlightState(flight_dir)
    polls: list[int] = []
    real_poll = state._reader.poll
    monkeypatch.setattr(
        state._reader,
        "poll",
        lambda budget=None, changed=None: polls.append(1) or real_poll(budget, changed),
    )
    proc_walks: list[str] = []
    monkeypatch.setattr(flightstate, "list_pids", lambda proc: proc_walks.append(proc) or [])
    monkeypatch.setattr(app_module, "API_REFRESH_S", 3600.0)  # no refresher runs here
    client = serve_app(app_as_served(state))
    answers = [client.get(path).json() for path in ("/api/v1/phases", "/api/v1/census") * 3]
    assert not any(answer.pop("page")["truncated"] for answer in answers)  # all on one page
    assert client.get("/api/v1/boots").json()["boots"][0]["boot"] == "boot-1"
    assert len(polls) == 1  # the first request tailed the directory; the rest read the state
    assert proc_walks == []  # a rank in the host's PID namespace names its own host pid
    assert answers[0] == json.loads(json.dumps(phases_document(read_flight(flight_dir))))
    assert answers[1] == json.loads(json.dumps(census_document(read_flight(flight_dir))))
    assert client.get("/api/v1/census?boot=nope").status_code == 404


def test_api_answers_are_paged_and_the_pages_add_up_to_the_document(
    flight_dir: Path, serve_app: ServeApp
) -> None:
    for rank in range(5):
        rec = rank_recorder(flight_dir, "boot-1", rank, host="elsewhere")
        rec.write_record(mark("pre_weight_load"))
        rec.write_record(census(1, [["world:0-4", "all_reduce", 3 + rank % 2]]))
    state = FlightState(flight_dir)
    client = serve_app(app_as_served(state))
    whole = json.loads(json.dumps(phases_document(read_flight(flight_dir))))
    seen: list[dict[str, object]] = []
    url: str | None = "/api/v1/phases?boot=boot-1&limit=2"
    while url is not None:
        answer = client.get(url).json()
        assert len(answer["processes"]) <= 2 and answer["page"]["total"]["processes"] == 5
        seen += answer["processes"]
        url = answer["page"]["next"]
    assert seen == whole["processes"]  # every process once, in order, over three pages

    first = client.get("/api/v1/census?limit=1").json()
    assert first["page"]["truncated"] is True and len(first["ranks"]) == 1
    assert first["page"]["total"]["ranks"] == 5 and first["divergent"] is True
    assert client.get("/api/v1/census").json()["page"]["limit"] == app_module.DEFAULT_LIMIT
    assert client.get("/api/v1/oom?offset=3").json()["page"]["truncated"] is False
    too_many = f"/api/v1/phases?limit={app_module.MAX_LIMIT + 1}"
    assert client.get(too_many).status_code == 422
    assert client.get("/api/v1/census?offset=-1").status_code == 422
