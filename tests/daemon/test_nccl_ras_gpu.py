"""The NCCL RAS source against a REAL NCCL job (GPU machine only): a one-GPU torch job with
two communicators, RAS on its own address (NCCL_RAS_ADDR), read by the daemon's own client
and by a real `rankscope serve`. With RANKSCOPE_RAS_OUT set, the raw replies the daemon's
client received are saved there (ras-<nccl version>-daemon-*.{json,txt}) as fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.daemon.test_daemon_flightstate import census, rank_recorder

from rankscope.daemon.collectors import nccl_ras
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.nccl_ras import Endpoint, parse_address, query
from rankscope.daemon.nccl_ras_report import parse_report
from support.services import free_port

JOB = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    dist.init_process_group("nccl", init_method=sys.argv[1], rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    second = dist.new_group([0])
    x = torch.ones(4, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
        dist.all_reduce(x, group=second)
    torch.cuda.synchronize()
    v = torch.cuda.nccl.version()
    print("ready", ".".join(map(str, v)) if isinstance(v, tuple) else v, flush=True)
    sys.stdin.read()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def nccl_job() -> Iterator[tuple[str, int, str]]:
    """(RAS address, job pid, NCCL version) of a running one-GPU NCCL job."""
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "NCCL_RAS_ADDR": address, "NCCL_RAS_ENABLE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB, f"tcp://127.0.0.1:{free_port()}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline().split()
    assert line[:1] == ["ready"], f"the NCCL job did not start: {line}"
    try:
        yield address, proc.pid, line[1]
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def _save(name: str, data: bytes) -> None:
    out = os.environ.get("RANKSCOPE_RAS_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_bytes(data)


@pytest.mark.gpu
def test_the_daemons_client_reads_a_real_nccl_job(nccl_job: tuple[str, int, str]) -> None:
    address, pid, version = nccl_job
    raw = query(parse_address(address))
    report = parse_report(raw)
    _save(f"ras-{version}-daemon-status.{'json' if report.format == 'json' else 'txt'}", raw)
    print(f"NCCL {version}: {report.format} report of {len(raw)} B, "
          f"{len(report.communicators)} communicators")  # fmt: skip
    assert report.nccl_version.split("+")[0] == version
    assert len(report.communicators) >= 2
    if report.format == "json":
        assert {r.pid for c in report.communicators for r in c.ranks} == {pid}


@pytest.mark.gpu
def test_a_real_nccl_jobs_ranks_map_to_its_flight_records(
    nccl_job: tuple[str, int, str], tmp_path: Path
) -> None:
    address, pid, _version = nccl_job
    rank_recorder(tmp_path, "gpu-boot", 0, pid=pid).write_record(census(1, []))
    state = FlightState(tmp_path)
    state.refresh()
    endpoint = Endpoint(address)
    endpoint.poll_once()
    view = endpoint.view
    assert view.last_success, view.last_error
    text = [
        (s.name, s.labels, s.value)
        for fam in nccl_ras.collect([endpoint], state)
        for s in fam.samples
    ]
    sizes = [(labels, v) for n, labels, v in text if n == "rankscope_nccl_communicator_size"]
    assert sizes and all(labels["boot"] == "gpu-boot" for labels, _ in sizes), sizes


@pytest.mark.gpu
def test_a_real_daemon_serves_a_real_nccl_jobs_ras(
    nccl_job: tuple[str, int, str], tmp_path: Path
) -> None:
    from test_daemon_serve import scrape, serve

    address, _pid, _version = nccl_job
    flight = tmp_path / "flight"
    flight.mkdir()
    with serve(
        flight,
        "--no-collector.cards",
        "--no-collector.holdings",
        "--collector.nccl-ras",
        f"--collector.nccl-ras.address={address}",
        "--collector.nccl-ras.interval=200ms",
        log=tmp_path / "serve.log",
    ) as url:
        deadline = time.monotonic() + 30
        text = scrape(url)
        while f'rankscope_nccl_ras_up{{endpoint="{address}"}} 1.0' not in text:
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
            text = scrape(url)
    _save("daemon-metrics.txt", text.encode())
    assert "rankscope_nccl_communicator_size{" in text
