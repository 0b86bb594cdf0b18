"""`rankscope serve` as a real process: /metrics checked by the real promtool, OpenMetrics
parsed by prometheus_client's parser, gzip, the landing page, the JSON API against the CLI,
and a real Prometheus (Debian's package) scraping it.

The flight directory is written by real rank processes through the probe (rankscope.rank.probe,
which on this GPU-less machine records torch and NVML as unmeasured) and the record writer,
plus marks with GPU figures written by the same writer. Cards come from the card engineer's
SIMULATED device source (a script naming the real pids of those rank processes).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_flightstate import GiB, census, mark, rank_recorder

from rankscope import catalog
from rankscope.record import BlockedIn, CensusLive, MarkArena, MarkDevice, Oom, OomHolder
from rankscope.record.reader import read_flight
from rankscope.reports.ledger import phases_document
from support.services import binary, free_port, prometheus, stop

BOOT = "boot-serve"

# A rank process: probe marks and census lines through the process-wide writer, then it
# stays alive (so the holdings can match its pid) until its stdin closes.
RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from rankscope.rank import probe
    from rankscope.rank.writer import RECORDER
    from rankscope.record import Census, Divergence
    rank = int(os.environ["RANK"])
    probe.configure(tp_rank=rank, pp_rank=0, runner="target")
    probe.mark("pre_weight_load")
    probe.mark("weights_loaded")
    counts = {("tp:0-1", "all_reduce"): 10 + rank, ("world:0-1", "barrier"): 1}
    RECORDER.write_record(Census(round=2, every=None, counts=counts))
    if rank == 0:
        RECORDER.write_record(Divergence(2, "tp:0-1", "all_reduce", {0: 10, 1: 11}, (0,)))
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def start_ranks(flight_dir: Path, boot: str, world: int) -> list[subprocess.Popen[str]]:
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANKSCOPE_DIR=str(flight_dir),
            RANKSCOPE_BOOT_ID=boot,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


def stop_processes(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.stdin is not None:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def get(
    url: str, headers: dict[str, str] | None = None, timeout: float = 10.0
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@contextlib.contextmanager
def serve(
    flight_dir: Path, *args: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run `rankscope serve` on a free loopback port until the block ends; yields its URL."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "rankscope", "serve",
        f"--flight-dir={flight_dir}", f"--web.listen-address=127.0.0.1:{port}", *args,
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rankscope serve exited {proc.returncode}: {log.read_text()}")
            try:
                with contextlib.closing(
                    __import__("socket").create_connection(("127.0.0.1", port), 0.2)
                ):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"rankscope serve did not listen: {log.read_text()}"
                    ) from None
                time.sleep(0.1)
        yield url
    finally:
        stop(proc, grace=10)


@dataclass
class Served:
    url: str
    flight_dir: Path
    rank_pids: list[int]
    log: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("serve")
    flight_dir = root / "flight"
    flight_dir.mkdir()
    # An older boot's mark with an impossible free byte count: nulled and counted.
    older = rank_recorder(flight_dir, "boot-older", 5, pid=1)
    older.write_record(mark("pre_weight_load", free=-1))
    ranks = start_ranks(flight_dir, BOOT, world=2)
    try:
        # Marks with GPU figures, as a probe on a GPU host writes them, for a third process.
        gpu_rank = rank_recorder(flight_dir, BOOT, 2, pid=ranks[0].pid + 100000)
        gpu_rank.write_record(mark("pre_weight_load", gpu=1, reserved=0, self_bytes=500 << 20))
        kv = MarkArena(reserved=40 * GiB, backed=24 * GiB, retained=1 * GiB)
        gpu_rank.write_record(mark("kv_pool_sized", gpu=1, reserved=30 * GiB, arenas={"kv": kv}))
        gpu_rank.write_record(census(2, [["tp:0-1", "all_reduce", 10]]))
        # Ranks 2 and 3 of a group tp:2-3 hung at different counts (their pids run no process:
        # the daemon names them dead, each with the collective it was in, rank 3 behind).
        for rank, pid, n in ((2, gpu_rank.process.pid, 5), (3, ranks[0].pid + 100001, 4)):
            writer = gpu_rank if rank == 2 else rank_recorder(flight_dir, BOOT, rank, pid=pid)
            stall = BlockedIn("tp:2-3", "all_reduce", n, time.time())
            writer.write_record(CensusLive({("tp:2-3", "all_reduce"): n}, stall))
        # An OOM instant of that rank on card 1, with the card's holders right then.
        gpu_rank.write_record(
            Oom(
                requested=2 * GiB,
                torch_free=40 * GiB,
                device=MarkDevice(index=1, uuid="GPU-sim-1", nvml_index=1),
                holders=[OomHolder(ranks[1].pid, 30 * GiB, "python3")],
            )
        )
        script = root / "cards.json"
        script.write_text(
            json.dumps(
                {
                    "cards": [
                        {
                            "index": 0, "uuid": "GPU-sim-0", "total": "80GiB", "free": "1GiB",
                            "processes": {str(ranks[0].pid): "30GiB", str(os.getpid()): "2GiB"},
                        },
                        {
                            "index": 1, "uuid": "GPU-sim-1", "total": "80GiB", "free": "40GiB",
                            "processes": {str(ranks[1].pid): "30GiB"},
                        },
                    ]
                }
            )
        )  # fmt: skip
        log = root / "serve.log"
        with serve(
            flight_dir,
            f"--device.script={script}",
            "--corridor.floor=2GiB",
            "--holdings.interval=100ms",
            log=log,
        ) as url:
            yield Served(url, flight_dir, [p.pid for p in ranks], log)
    finally:
        stop_processes(ranks)


def scrape(url: str) -> str:
    status, _headers, body = get(url + "/metrics")
    assert status == 200
    return body.decode()


def wait_for_metric(url: str, name: str, timeout: float = 10.0) -> str:
    """The exposition once ``name`` shows in it (the sampler and holdings run on threads)."""
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(url)
        if f"\n{name}{{" in text or f"\n{name} " in text:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} never appeared in /metrics:\n{text}")
        time.sleep(0.2)


def test_metrics_pass_promtool_check_metrics_with_no_findings(served: Served) -> None:
    text = wait_for_metric(served.url, "rankscope_gpu_process_bytes")
    result = subprocess.run(
        [binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", (
        result.stdout + result.stderr
    )


def test_every_exposed_metric_is_catalogued_and_every_entry_is_exposed(served: Served) -> None:
    text = wait_for_metric(served.url, "rankscope_gpu_process_bytes")
    exposed = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    uncatalogued = {name for name in exposed if name not in catalog.BY_SAMPLE}
    assert not uncatalogued
    # The nccl-ras collector is off by default; tests/daemon/test_nccl_ras.py checks its entries.
    never_exposed = {
        m.name
        for m in catalog.CATALOG
        if m.collector != "nccl-ras" and not exposed & set(catalog.exposed_names(m))
    }
    assert not never_exposed
    # Each series carries exactly the catalog's labels.
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            entry = catalog.BY_SAMPLE.get(s.name)
            assert entry is not None
            assert set(s.labels) <= set(entry.labels), (s.name, s.labels)


def test_the_records_of_real_rank_processes_show_and_unmeasured_is_absent(served: Served) -> None:
    text = scrape(served.url)
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    stamps = [
        s
        for s in samples
        if s.name == "rankscope_phase_timestamp_seconds" and s.labels["rank"] in ("0", "1")
    ]
    assert {(s.labels["rank"], s.labels["phase"]) for s in stamps} == {
        ("0", "pre_weight_load"), ("0", "weights_loaded"), ("1", "pre_weight_load"), ("1", "weights_loaded"),
    }  # fmt: skip
    assert {s.labels["pid"] for s in stamps} == {str(p) for p in served.rank_pids}
    # No torch and no GPU in those ranks: no reserved bytes for them, not zeros.
    reserved = {s.labels["rank"] for s in samples if s.name == "rankscope_phase_reserved_bytes"}
    assert reserved == {"2"}
    totals = {
        (s.labels["rank"], s.labels["group"]): s.value
        for s in samples
        if s.name == "rankscope_collectives_total"
    }
    assert totals[("0", "tp:0-1")] == 10 and totals[("1", "tp:0-1")] == 11
    divergence = [s for s in samples if s.name == "rankscope_census_divergence"]
    assert [(s.labels["group"], s.value) for s in divergence] == [("tp:0-1", 1.0)]


def test_openmetrics_is_served_when_asked_for_and_parses(served: Served) -> None:
    status, headers, body = get(
        served.url + "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(text)}
    assert families["rankscope_collectives"].type == "counter"
    assert families["rankscope_phase_reserved_bytes"].unit == "bytes"
    plain = get(served.url + "/metrics")[1]
    assert plain["content-type"].startswith("text/plain; version=0.0.4")


def test_metrics_are_gzipped_when_accepted(served: Served) -> None:
    status, headers, body = get(served.url + "/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("content-encoding") == "gzip"
    assert b"rankscope_build_info" in gzip.decompress(body)
    _status, plain_headers, plain = get(served.url + "/metrics")
    assert "content-encoding" not in {k.lower() for k in plain_headers}
    assert plain.startswith(b"# HELP")


def test_landing_health_and_readiness(served: Served) -> None:
    status, _h, page = get(served.url + "/")
    assert status == 200
    for href in ("metrics", "healthz", "readyz", "api/v1/boots", "api/v1/cards", "api/v1/census"):
        assert f'href="{href}"'.encode() in page or f'href="/{href}"'.encode() in page, href
    assert get(served.url + "/healthz")[:1] == (200,)
    status, _h, body = get(served.url + "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True


def test_the_api_answers_what_the_cli_prints(served: Served) -> None:
    status, _h, body = get(served.url + "/api/v1/boots")
    assert status == 200
    cli = subprocess.run(
        [sys.executable, "-m", "rankscope", "boots", str(served.flight_dir), "--json"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert json.loads(body) == json.loads(cli.stdout)
    status, _h, body = get(served.url + f"/api/v1/phases?boot={BOOT}")
    assert status == 200
    assert json.loads(body).pop("page")["truncated"] is False
    assert without_page(body) == json.loads(
        json.dumps(phases_document(read_flight(served.flight_dir, boot=BOOT)))
    )
    status, _h, body = get(served.url + "/api/v1/phases?boot=no-such-boot")
    assert status == 404 and b"no-such-boot" in body
    status, _h, body = get(served.url + "/api/v1/census")
    cli = subprocess.run(
        [sys.executable, "-m", "rankscope", "census", str(served.flight_dir), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status == 200 and without_page(body) == json.loads(cli.stdout)
    assert json.loads(body)["divergent"] is True
    status, _h, body = get(served.url + "/api/v1/cards")
    cards = json.loads(body)["cards"]
    assert status == 200 and {c["uuid"] for c in cards} == {"GPU-sim-0", "GPU-sim-1"}


def test_a_real_prometheus_scrapes_the_daemon(served: Served, tmp_path: Path) -> None:
    target = served.url.removeprefix("http://")
    with prometheus(tmp_path / "prom", scrape_targets=[target], scrape_interval="1s") as prom:
        deadline = time.monotonic() + 30
        while True:
            free_min = prom.query('rankscope_gpu_free_min_bytes{uuid="GPU-sim-0"}')
            collectives = prom.query('rankscope_collectives_total{group="tp:0-1"}')
            reserved = prom.query('rankscope_phase_reserved_bytes{phase="kv_pool_sized"}')
            if free_min and len(collectives) == 3 and reserved:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"series missing: {free_min} {collectives} {reserved}")
            time.sleep(0.5)
        assert prom.targets_up()
        assert float(free_min[0]["value"][1]) == 1 * GiB
        assert float(reserved[0]["value"][1]) == 30 * GiB
        assert reserved[0]["metric"]["rank"] == "2"
        by_rank = {c["metric"]["rank"]: float(c["value"][1]) for c in collectives}
        assert by_rank == {"0": 10.0, "1": 11.0, "2": 10.0}
        up = prom.query('rankscope_up{source="flight"}')
        assert [float(u["value"][1]) for u in up] == [1.0]


def without_page(body: bytes) -> dict[str, object]:
    """An API answer without its paging section: the document the CLI prints."""
    doc = json.loads(body)
    del doc["page"]
    return doc
