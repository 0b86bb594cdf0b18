"""The NCCL RAS source against a local STAND-IN RAS server (tests/support/ras_standin.py:
NCCL's RAS needs a GPU) that replays the real 2.28.9 replies byte-for-byte, the two-GPU
shapes edited from them, and broken endpoints; then the whole path, stand-in RAS -> a real
`rankscope serve` process -> /metrics, checked by the real promtool."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_flightstate import census, rank_recorder
from tests.daemon.test_daemon_serve import scrape, serve

import nccl_ras_shapes as shapes
from rankscope import catalog
from rankscope.daemon.collectors import nccl_ras
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.nccl_ras import Endpoint, parse_address, pollers
from rankscope.daemon.registry import Collector, TimedCollectors
from support.ras_standin import StandInRas
from support.services import binary

REAL_JSON = shapes.REAL_JSON
REAL_TEXT = shapes.REAL_TEXT
PLAIN_LABELS = ("endpoint", "reason")


def poll(address: str, times: int = 1, **kw: float) -> Endpoint:
    endpoint = Endpoint(address, **kw)  # type: ignore[arg-type]
    for _ in range(times):
        endpoint.poll_once()
    return endpoint


def test_the_real_json_reply_is_polled_through_the_protocol() -> None:
    with StandInRas(REAL_JSON) as ras:
        view = poll(ras.address).view
    assert (view.last_success, view.last_error) == (True, None)
    assert view.report is not None and view.report.format == "json"
    assert len(view.comms) == 2


def test_a_server_before_2_28_7_answers_text_and_is_parsed_as_text() -> None:
    with StandInRas(REAL_TEXT, mode="pre2287") as ras:
        view = poll(ras.address).view
    assert view.last_success and view.report is not None and view.report.format == "text"


@pytest.mark.parametrize("text", ["h:0", "h:+80", "h: 80", "h:80 ", "h:65536", ":80", "h"])
def test_a_ras_address_needs_a_host_and_a_port_in_digits(text: str) -> None:
    with pytest.raises(ValueError, match=r"nccl-ras\.address"):
        parse_address(text)
    assert parse_address("[::1]:28028") == ("::1", 28028)


def test_no_endpoint_is_refused() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        view = poll(f"127.0.0.1:{s.getsockname()[1]}").view
    assert (view.last_success, view.last_error, view.errors["refused"]) == (False, "refused", 1)


@pytest.mark.parametrize(
    ("mode", "report", "reason"),
    [
        ("silent", REAL_JSON, "timeout"),  # accepts, never answers
        ("dribble", REAL_JSON, "timeout"),  # a byte every 0.2 s: the report deadline ends it
        ("protocol3", REAL_JSON, "unknown_version"),
        ("reset", REAL_JSON, "truncated"),  # half the report, then a TCP reset
        ("replay", REAL_JSON[: len(REAL_JSON) // 2], "truncated"),
        ("replay", REAL_TEXT[:250], "truncated"),
        ("replay", b"<html>not RAS</html>\n", "malformed"),
        ("replay", REAL_JSON.replace(b'"2.28.9"', b'"v9"'), "unknown_version"),
        ("replay", b" " * (3 << 20) + REAL_JSON, "too_large"),
    ],
)
def test_a_broken_endpoint_is_a_failed_poll_with_its_reason(
    mode: str, report: bytes, reason: str
) -> None:
    with StandInRas(report, mode=mode) as ras:
        view = poll(ras.address, report_timeout=1.0, max_bytes=1 << 20).view
    assert (view.last_success, view.last_error, view.errors[reason]) == (False, reason, 1)
    assert view.report is None


def test_a_failed_poll_keeps_the_last_good_report_and_says_why() -> None:
    with StandInRas(REAL_JSON, REAL_JSON[:100]) as ras:
        endpoint = poll(ras.address, times=2)
    view = endpoint.view
    assert (view.polls, view.last_success, view.last_error) == (2, False, "truncated")
    assert view.report is not None and len(view.comms) == 2


def test_a_count_mismatch_is_reported_only_once_it_persists_with_stuck_laggards() -> None:
    """Two-rank shapes edited from the real one-GPU JSON (no two-GPU machine is lent)."""
    stuck = [shapes.two_rank_json((10, 9))] * 3
    with StandInRas(*stuck) as ras:
        endpoint = Endpoint(ras.address, persist_polls=3)
        endpoint.poll_once()
        endpoint.poll_once()
        assert endpoint.view.persisting[(shapes.REAL_HASH, SECONDARY)] == ()
        endpoint.poll_once()
        assert endpoint.view.persisting[(shapes.REAL_HASH, SECONDARY)] == ("AllReduce",)
    # In flight: the counts differ at every poll but the laggard keeps launching.
    moving = [shapes.two_rank_json((10 + i, 9 + i)) for i in range(4)]
    with StandInRas(*moving) as ras:
        assert (
            poll(ras.address, times=4, persist_polls=3).view.persisting[
                (shapes.REAL_HASH, SECONDARY)
            ]
            == ()
        )


SECONDARY = "0xf0f5947519ffabd8:0x40802503e7d6e292"


def test_a_status_mismatch_persists_like_a_count_mismatch() -> None:
    """Shape edited from the real one-GPU JSON: the second rank aborted."""
    with StandInRas(shapes.two_rank_json((5, 5), peer_abort=True)) as ras:
        view = poll(ras.address, times=2, persist_polls=2).view
    assert view.persisting[(shapes.REAL_HASH, SECONDARY)] == ("status",)


def test_communicators_of_a_job_sharing_the_port_survive_the_other_jobs_replies() -> None:
    """The real replies of two jobs on the default port (SO_REUSEPORT hands connections to
    either): job A's two communicators stay while job B answers, until forget_after polls."""
    job_a = REAL_JSON
    job_b = (shapes.FIXTURES / "ras-2.28.9-jobC-status.json").read_bytes()
    with StandInRas(job_a, job_b) as ras:
        endpoint = poll(ras.address, times=2)
        assert len(endpoint.view.comms) == 3
        for _ in range(endpoint.forget_after):
            endpoint.poll_once()
    assert len(endpoint.view.comms) == 1


def samples(
    *endpoints: Endpoint, state: FlightState
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    collector = Collector("nccl-ras", lambda: nccl_ras.collect(list(endpoints), state))
    for fam in TimedCollectors([collector]).collect():
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def find(got: dict, name: str, **labels: str) -> list[float]:  # type: ignore[type-arg]
    return [v for (n, ls), v in got.items() if n == name and labels.items() <= dict(ls).items()]


def test_ranks_map_to_the_flight_records_boot_and_rank_by_pid(tmp_path: Path) -> None:
    """The real report's pid 668 is rank 0 of boot b1 in the flight records; the edited
    second rank (pid 669) has no records and stays under NCCL's ids."""
    rank_recorder(tmp_path, "b1", 0, pid=668).write_record(census(1, []))
    rank_recorder(tmp_path, "b1", 5, pid=4242).write_record(census(1, []))
    state = FlightState(tmp_path)
    state.refresh()
    with StandInRas(shapes.two_rank_json((3, 3))) as ras:
        endpoint = poll(ras.address)
    got = samples(endpoint, state=state)
    mine = find(got, "rankscope_nccl_collectives_total", pid="668", op="AllReduce")
    assert mine == [3.0]
    assert find(got, "rankscope_nccl_collectives_total", pid="668", rank="0", boot="b1")
    assert find(got, "rankscope_nccl_collectives_total", pid="669", rank="", boot="b1")
    assert find(got, "rankscope_nccl_communicator_size", boot="b1") == [2.0]


def test_a_pid_on_two_hosts_is_not_mapped(tmp_path: Path) -> None:
    """Shape edited from the real JSON: the peer has pid 668 too, on another node."""
    rank_recorder(tmp_path, "b1", 0, pid=668).write_record(census(1, []))
    state = FlightState(tmp_path)
    state.refresh()
    report = shapes.two_rank_json((3, 3)).replace(b'"pid": 669', b'"pid": 668')
    report = report.replace(
        b'"host": "192.0.2.2",\n          "pid": 668,\n          "cuda_dev": 1',
        b'"host": "192.0.2.3",\n          "pid": 668,\n          "cuda_dev": 1',
    )
    with StandInRas(report) as ras:
        got = samples(poll(ras.address), state=state)
    assert find(got, "rankscope_nccl_collectives_total", host="192.0.2.3", op="AllReduce")
    assert find(got, "rankscope_nccl_collectives_total", rank="0") == []
    assert find(got, "rankscope_nccl_communicator_size", boot="") == [2.0]


def test_a_dead_peer_is_exported_from_json_and_text(tmp_path: Path) -> None:
    """Shapes edited from the real one-GPU reports (JSON missing_ranks; text DEAD section)."""
    state = FlightState(tmp_path)
    with StandInRas(shapes.dead_peer_json()) as ras, StandInRas(shapes.dead_text()) as text:
        got = samples(poll(ras.address), poll(text.address), state=state)
    assert find(got, "rankscope_nccl_dead_processes", endpoint=ras.address) == [1.0]
    assert find(got, "rankscope_nccl_dead_processes", endpoint=text.address) == [1.0]
    assert find(got, "rankscope_nccl_rank_missing", state="dead", pid="669") == [1.0]
    assert find(got, "rankscope_nccl_communicator_ranks_missing") == [1.0]
    with StandInRas(shapes.dead_peer_json(considered_dead=False)) as ras:
        got = samples(poll(ras.address), state=state)
    assert find(got, "rankscope_nccl_dead_processes") == [0.0]
    assert find(got, "rankscope_nccl_rank_missing", state="unresponsive") == [1.0]


def test_the_self_metrics_name_the_last_failure_and_count_them(tmp_path: Path) -> None:
    state = FlightState(tmp_path)
    with StandInRas(REAL_JSON, b"junk\n") as ras:
        endpoint = poll(ras.address, times=2)
    got = samples(endpoint, state=state)
    assert find(got, "rankscope_nccl_ras_up") == [0.0]
    assert find(got, "rankscope_nccl_ras_last_error", reason="malformed") == [1.0]
    assert sum(find(got, "rankscope_nccl_ras_last_error")) == 1.0
    assert find(got, "rankscope_nccl_ras_poll_errors_total", reason="malformed") == [1.0]
    assert find(got, "rankscope_nccl_ras_polls_total") == [2.0]
    assert find(got, "rankscope_nccl_info", version="2.28.9", format="json") == [1.0]


def test_the_poller_thread_keeps_polling_and_stops(tmp_path: Path) -> None:
    with StandInRas(REAL_JSON) as ras:
        [poller] = pollers([Endpoint(ras.address)], interval=0.05)
        assert poller.after_each  # never back to back: the RAS server is inside the ranks
        poller.start()
        deadline = time.monotonic() + 10
        while ras.connections < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        poller.stop()
    assert ras.connections >= 3
    assert not any(t.name == "rankscope-nccl-ras" for t in threading.enumerate())


# --- end to end: stand-in RAS -> real `rankscope serve` -> /metrics --------------------------


def test_a_real_daemon_serves_ras_metrics_that_promtool_accepts(tmp_path: Path) -> None:
    """Three stand-in endpoints: the real 2.28.9 JSON (byte-for-byte), the edited two-GPU
    dead-peer shape, and one that accepts and never answers, which must not hold up a
    scrape nor the other endpoints and ends as a timeout: every nccl_ras catalog entry
    shows, promtool finds nothing to say."""
    flight = tmp_path / "flight"
    flight.mkdir()
    rank_recorder(flight, "b1", 0, pid=668).write_record(census(1, []))
    with (
        StandInRas(REAL_JSON) as real,
        StandInRas(shapes.dead_peer_json()) as dead,
        StandInRas(REAL_JSON, mode="silent") as silent,
        serve(
            flight,
            "--no-collector.cards",
            "--no-collector.holdings",
            "--collector.nccl-ras",
            # The silent one first: a poller that went through endpoints in turn would
            # hold the others back behind it.
            f"--collector.nccl-ras.address={silent.address}",
            f"--collector.nccl-ras.address={real.address}",
            f"--collector.nccl-ras.address={dead.address}",
            "--collector.nccl-ras.interval=100ms",
            "--collector.nccl-ras.timeout=30s",
            log=tmp_path / "serve.log",
        ) as url,
    ):
        deadline = time.monotonic() + 30
        text = scrape(url)
        while f'rankscope_nccl_ras_up{{endpoint="{dead.address}"}} 1.0' not in text:
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
            text = scrape(url)
        # The silent endpoint holds its own poll until the handshake deadline (3 s): the
        # scrapes answered meanwhile, with no poll of it finished yet.
        assert f'rankscope_nccl_ras_polls_total{{endpoint="{silent.address}"}} 0.0' in text
        while (
            f'rankscope_nccl_ras_last_error{{endpoint="{silent.address}",reason="timeout"}} 1.0'
            not in text
        ):
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
            text = scrape(url)
    result = subprocess.run(
        [binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout == result.stderr == "", result.stdout
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    ras_entries = [m for m in catalog.CATALOG if m.collector == "nccl-ras"]
    assert {m.name for m in ras_entries if not names & set(catalog.exposed_names(m))} == set()
    assert 'rankscope_collector_success{collector="nccl-ras"} 1.0' in text
    assert f'rankscope_nccl_collectives_total{{boot="b1",comm="{shapes.REAL_HASH}"' in text
