"""The daemon's OOM instants: the sampler's exhaustion hook (one process-list read per onset,
the worst minimum followed without reads), and a real `rankscope serve` that counts the
probe's oom lines and the exhaustions in rankscope_oom_events_total and serves them in
/api/v1/oom and /api/v1/cards, and whose exhaustions `rankscope oom DIR --daemon URL` shows
(never written to DIR). Cards are the SIMULATED scripted source (no GPU here); the holders
are real processes, named through the real /proc."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.cli.test_oom_cli import header, oom_line, rank_3_of_b1, run, write
from tests.daemon.test_daemon_serve import get, serve

from rankscope.daemon.collectors import oom
from rankscope.daemon.devices import ScriptedSource, write_script
from rankscope.daemon.flightstate import FlightState, RankProcess
from rankscope.daemon.oom import ExhaustionWatch, OomBook
from rankscope.daemon.sampler import FloorValue, Sampler
from rankscope.procfs import read_start_ticks
from rankscope.reports.oom import Holding, SamplerOom, sampler_ooms_of_page
from support.waiting import wait_for

GiB = 1 << 30
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


def card(free: int, procs: dict[int, int]) -> dict[str, Any]:
    return {
        "index": 0,
        "uuid": "GPU-sim-0",
        "total": 80 * GiB,
        "free": free,
        "processes": {str(p): b for p, b in procs.items()},
    }


def test_one_process_list_read_per_onset_and_the_worst_minimum_followed(
    tmp_path: Path, holder: subprocess.Popen[bytes]
) -> None:
    script = tmp_path / "cards.json"
    me = os.getpid()
    ranks = [RankProcess("h", me, read_start_ticks(), None, "b1", 2)]
    procs = {holder.pid: 70 * GiB, me: 9 * GiB}
    write_script(script, [card(1 * GiB, procs)])
    sampler = Sampler(ScriptedSource(script), interval=0.1)
    walls = iter(float(t) for t in range(1000, 2000))
    watch = ExhaustionWatch(
        sampler, lambda: ranks, FloorValue(bytes=256 * MiB), wall=lambda: next(walls)
    )

    def at(t: float, free: int) -> None:
        write_script(script, [card(free, procs)])
        sampler.sample(now=t)

    at(0.0, 1 * GiB)
    assert watch.events() == [] and watch.process_list_reads == 0
    at(0.1, 200 * MiB)  # onset
    at(0.2, 40 * MiB)  # deeper: the worst minimum moves, no new read
    at(0.3, 90 * MiB)
    assert watch.process_list_reads == 1
    (event,) = watch.events()
    assert (event.onset_free, event.free) == (200 * MiB, 40 * MiB)
    assert event.wall > event.onset_wall
    roles = [(h.pid, h.comm, h.role, h.rank, h.bytes) for h in event.holders or ()]
    assert roles == [
        (holder.pid, "sleep", "foreign", None, 70 * GiB),
        (me, roles[1][1], "rank", 2, 9 * GiB),
    ]
    at(0.4, 2 * GiB)  # recovered
    at(0.5, 0)  # a new onset: a new event, a second read
    assert watch.process_list_reads == 2
    assert [e.free for e in watch.events()] == [40 * MiB, 0]
    assert watch.counts() == {(0, "GPU-sim-0"): 2}


def test_a_failing_process_list_keeps_the_event_with_a_why(tmp_path: Path) -> None:
    script = tmp_path / "cards.json"
    write_script(script, [card(0, {})])
    sampler = Sampler(ScriptedSource(script), interval=0.1)
    watch = ExhaustionWatch(sampler, lambda: [], FloorValue(bytes=256 * MiB))

    def broken(slot: int) -> dict[int, int | None]:
        raise RuntimeError("GPU is lost")

    sampler.source.read_processes = broken  # type: ignore[method-assign]
    sampler.sample(now=0.0)
    (event,) = watch.events()
    assert event.holders is None and "GPU is lost" in "; ".join(event.why)
    assert sampler.samples == 1  # the sample itself completed


def held_series(book: OomBook) -> list[tuple[str, ...]]:
    """The rankscope_oom_holder_bytes samples one collection of the OOM collector yields."""
    (fam,) = [
        f for f in oom.collect(book, max_per_card=32) if f.name == "rankscope_oom_holder_bytes"
    ]
    return [(s.labels["pid"], s.labels["role"], s.labels["rank"]) for s in fam.samples]


def test_the_book_parses_oom_lines_once_per_change_into_typed_holdings(
    flight_dir: Path, holder: subprocess.Popen[bytes]
) -> None:
    # A real rank (this process) recorded an OOM; the real `sleep` held the card as a foreign.
    me, start = rank_3_of_b1(flight_dir)
    sleep_start = read_start_ticks(holder.pid)
    assert sleep_start is not None
    line = oom_line("b1", me, start, 3, 1796000000.0)
    line["holders"] = [
        {"pid": holder.pid, "bytes": 70 * GiB, "comm": "sleep", "start_ticks": sleep_start},
        {"pid": me, "bytes": 6 * GiB, "comm": "python3", "start_ticks": start},
    ]
    write(flight_dir, f"oom-h1-{me}-{start}.jsonl", line)
    book = OomBook(FlightState(flight_dir), None)

    (first,) = book.probe_instants()
    assert first.holders is not None and all(isinstance(h, Holding) for h in first.holders)
    assert held_series(book) == [(str(holder.pid), "foreign", ""), (str(me), "rank", "3")]
    held_series(book)  # scrapes with nothing new serve the instants parsed before
    assert book.probe_instants()[0] is first

    # The rank processes changed (the `sleep` turns out to be rank 5 of boot b1): parsed again.
    write(
        flight_dir,
        f"marks-h1-{holder.pid}-{sleep_start}.jsonl",
        {**header("mark", "b1", holder.pid, sleep_start, 5, 101.0), "phase": "x"},
    )
    book.state.refresh()
    assert held_series(book) == [(str(holder.pid), "rank", "5"), (str(me), "rank", "3")]
    (renamed,) = book.probe_instants()
    assert renamed is not first

    # A new oom line: parsed again, the newest is the card's latest.
    write(flight_dir, f"oom-h1-{me}-{start}.jsonl", {**line, "wall": 1796000001.0, "holders": []})
    book.state.refresh()
    assert [i.wall for i in book.probe_instants()] == [1796000000.0, 1796000001.0]
    assert book.probe_instants()[0] is not renamed
    assert held_series(book) == []


def serve_script(tmp_path: Path, flight_dir: Path, script: Path, *args: str) -> Any:
    """A real `rankscope serve` of this tree on the scripted cards, sampling every 50 ms."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    return serve(
        flight_dir,
        f"--device.script={script}",
        "--sampler.interval=50ms",
        *args,
        log=tmp_path / "serve.log",
        env=env,
    )


def scrape_oom(url: str) -> dict[tuple[tuple[str, str], ...], float]:
    _, _, body = get(url + "/metrics")
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == "rankscope_oom_events_total":
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_serve_counts_both_sources_and_serves_the_latest_oom_per_card(
    tmp_path: Path, flight_dir: Path, holder: subprocess.Popen[bytes]
) -> None:
    # Rank 3 of boot b1 recorded an OOM; the foreign `sleep` held 70 GiB of the simulated card.
    me, start = rank_3_of_b1(flight_dir)
    line = oom_line("b1", me, start, 3, 1796000000.0)
    line["device"]["uuid"] = "GPU-sim-0"
    line["device"]["nvml_index"] = 0
    line["holders"] = [
        {
            "pid": holder.pid,
            "bytes": 70 * GiB,
            "comm": "sleep",
            "start_ticks": read_start_ticks(holder.pid),
        },
        {"pid": me, "bytes": 6 * GiB, "comm": "python3", "start_ticks": start},
    ]
    write(flight_dir, f"oom-h1-{me}-{start}.jsonl", line, line)  # torch retried: two OOMs
    script = tmp_path / "cards.json"
    write_script(script, [card(10 * GiB, {holder.pid: 70 * GiB})])
    with serve_script(tmp_path, flight_dir, script, "--oom.free-below=256MiB") as url:
        probe_key = (
            ("boot", "b1"),
            ("gpu", "0"),
            ("pid", str(me)),
            ("rank", "3"),
            ("uuid", "GPU-sim-0"),
        )
        assert wait_for(lambda: scrape_oom(url).get(probe_key), what="probe OOM counted") == 2
        sampler_key = (("boot", ""), ("gpu", "0"), ("pid", ""), ("rank", ""), ("uuid", "GPU-sim-0"))
        assert sampler_key not in scrape_oom(url)  # 10 GiB free: no exhaustion

        write_script(script, [card(30 * MiB, {holder.pid: 70 * GiB})])
        assert wait_for(lambda: scrape_oom(url).get(sampler_key), what="exhaustion counted") == 1

        _, _, body = get(url + "/api/v1/oom")
        docs = json.loads(body)["ooms"]
        assert [d["source"] for d in docs] == ["probe", "probe", "sampler"]  # oldest first
        assert docs[0]["requested"] == 20 * GiB and docs[0]["rank"] == 3
        assert docs[0]["holders"][0]["pid"] == holder.pid
        assert docs[0]["holders"][0]["role"] == "foreign"
        assert docs[0]["holders"][1]["role"] == "rank" and docs[0]["holders"][1]["boot"] == "b1"
        assert docs[2]["free"] == 30 * MiB
        assert [(h["pid"], h["comm"], h["role"]) for h in docs[2]["holders"]] == [
            (holder.pid, "sleep", "foreign")
        ]

        _, _, body = get(url + "/api/v1/cards")
        (card_doc,) = json.loads(body)["cards"]
        assert card_doc["last_oom"]["source"] == "sampler"

        _, _, body = get(url + "/metrics")
        held = [
            s
            for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples
            if s.name == "rankscope_oom_holder_bytes"
        ]
        assert [(s.labels["pid"], s.labels["comm"], s.labels["role"], s.value) for s in held] == [
            (str(holder.pid), "sleep", "foreign", 70 * GiB)
        ]


def test_the_cli_reads_the_sampler_entry_the_daemon_writes_and_skips_a_bad_one() -> None:
    sleep = Holding(41, "sleep", 70 * GiB, "foreign", None, None)
    rank = Holding(42, "python3", 9 * GiB, "rank", "b1", 2)
    x = SamplerOom(11.0, 0, "GPU-sim-0", 40 * MiB, 10.0, 200 * MiB, (sleep, rank))
    bad = {**x.as_json(), "free": "lots"}
    probe = {"source": "probe", "wall": 9.0}  # the flight directory has it
    page = {"ooms": [probe, x.as_json(), bad, 7], "page": {"next": "/api/v1/oom?offset=4"}}
    (read,), skipped, following = sampler_ooms_of_page(page)
    assert (read.wall, read.gpu, read.uuid, read.free) == (11.0, 0, "GPU-sim-0", 40 * MiB)
    assert (read.onset_wall, read.onset_free) == (10.0, 200 * MiB)
    assert [(h.pid, h.comm, h.bytes, h.role, h.boot, h.rank) for h in read.holders or ()] == [
        (41, "sleep", 70 * GiB, "foreign", None, None),
        (42, "python3", 9 * GiB, "rank", "b1", 2),
    ]
    assert skipped == ["free: 'lots'", "ooms[]: 7"] and following == "/api/v1/oom?offset=4"
    assert read.as_json() == x.as_json()  # `rankscope oom --json` prints the API's own form
    unread = SamplerOom(10.0, 0, "GPU-sim-0", 0, 10.0, 0, None, ("process list read failed: x",))
    assert SamplerOom.parse(unread.as_json()).holders is None
    assert SamplerOom.parse(unread.as_json()).as_json() == unread.as_json()
    # A daemon whose oom collector is off says why: an error, not "no OOM recorded".
    with pytest.raises(ValueError, match="records no OOM: the oom collector is off"):
        sampler_ooms_of_page({"ooms": [], "why": "the oom collector is off"})


def test_rankscope_oom_shows_the_daemons_sampler_ooms_when_asked(
    tmp_path: Path, flight_dir: Path, holder: subprocess.Popen[bytes]
) -> None:
    # boot b0 (older) and b1 (latest; this process stands for its rank 3, which recorded an
    # OOM); the card is exhausted from the daemon's first sample, the `sleep` holding it.
    write(
        flight_dir,
        "marks-h1-300-30.jsonl",
        {**header("mark", "b0", 300, 30, 0, 50.0), "phase": "x"},
    )
    me, start = rank_3_of_b1(flight_dir)
    write(flight_dir, f"oom-h1-{me}-{start}.jsonl", oom_line("b1", me, start, 3, 1000.0))
    listing = {p.name: p.stat().st_size for p in flight_dir.iterdir()}
    script = tmp_path / "cards.json"
    write_script(script, [card(30 * MiB, {holder.pid: 70 * GiB})])
    with serve_script(tmp_path, flight_dir, script) as url:
        exhausted = (("boot", ""), ("gpu", "0"), ("pid", ""), ("rank", ""), ("uuid", "GPU-sim-0"))
        assert wait_for(lambda: scrape_oom(url).get(exhausted), what="exhaustion counted") == 1

        (probe_only,) = run(str(flight_dir)).stdout.splitlines()  # DIR alone: the rank's OOM
        # a proxy for the internet in the environment (here a closed port) is not used for
        # a daemon on this host
        dead_proxy = {"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
        asked = run(str(flight_dir), "--daemon", url, env_extra=dead_proxy)
        assert asked.returncode == 0, asked.stderr
        probe, sampled = asked.stdout.splitlines()  # oldest first
        assert probe == probe_only and "rank 3 pid" in probe
        assert "gpu 0 (GPU-sim-0)  seen by the daemon's sampler (no rank's record)" in sampled
        assert "free 0.03 GiB at worst" in sampled
        assert sampled.endswith(f"holders: {holder.pid} sleep foreign 70.00 GiB")

        doc = json.loads(run(str(flight_dir), "--json", "--daemon", url).stdout)
        (entry,) = doc["sampler"]
        assert entry["source"] == "sampler" and entry["requested"] is None  # the API's form
        assert entry["free"] == 30 * MiB and entry["uuid"] == "GPU-sim-0"
        assert [(h["pid"], h["role"]) for h in entry["holders"]] == [(holder.pid, "foreign")]
        assert len(doc["ooms"]) == 1
        older = run(str(flight_dir), "--boot", "b0", "--daemon", url)
        assert older.stdout == "no OOM recorded for boot b0\n"  # it ended before the exhaustion
    # The daemon wrote nothing into the flight directory: the exhaustion lived in the daemon.
    assert {p.name: p.stat().st_size for p in flight_dir.iterdir()} == listing

    gone = run(str(flight_dir), "--daemon", url)
    assert gone.returncode == 1 and f"rankscope oom: daemon {url}:" in gone.stderr
    assert gone.stdout.splitlines() == [probe_only]  # what DIR holds is still printed
