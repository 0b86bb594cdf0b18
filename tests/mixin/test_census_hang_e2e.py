"""End to end, a hang: a real job under `rankscope run -- torchrun` (three gloo ranks, no code
change, no --compare) -> its flight directory -> the real daemon -> a real Prometheus with the
shipped rules (RankscopeCensusHang's `for:` as shipped, 10 s) -> a real Alertmanager with the
shipped routing -> a webhook here. Rank 2 skips its 6th all_reduce and all-gathers instead:
the job hangs, and RankscopeCensusHang must page, naming rank 2 behind on all_reduce (and
ranks 0 and 1 behind on the all_gather rank 2 is in), within BOUND_S of the hang's start
(rank 2's fault line)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.mixin.test_e2e_alerts import Webhook, alertmanager_config, wait_for
from tests.support import services
from tests.support.armed_venv import ArmedVenv, make_armed_venv

from rankscope.mixin import render
from rankscope.procfs import read_start_ticks

PROGRAM = Path(__file__).parents[1] / "programs" / "census_faults.py"
BOUND_S = 30.0  # the stated bound: hang start -> page, at the shipped `for:` and 1 s intervals


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> ArmedVenv:
    return make_armed_venv(tmp_path_factory.mktemp("venv") / "armed")


@contextlib.contextmanager
def hung_job(venv: ArmedVenv, flight: Path, log: Path) -> Iterator[threading.Event]:
    """The job, and an event set when rank 2 prints its fault line (the hang starts)."""
    job = subprocess.Popen(
        [
            venv.python, "-m", "rankscope", "run", "--dir", str(flight), "--",
            "torchrun", "--nproc-per-node", "3", "--master-port", str(services.free_port()),
            str(PROGRAM), "--fault", "skip-hang", "--rank", "2", "--step", "5", "--steps", "40",
        ],
        env=venv.env(TORCHELASTIC_ERROR_FILE=""),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    hang = threading.Event()

    def read() -> None:
        assert job.stdout is not None
        with open(log, "w") as out:
            for line in job.stdout:
                out.write(line)
                if line.startswith("fault skip-hang"):
                    hang.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        yield hang
    finally:
        for path in flight.glob("*.jsonl"):  # torchrun's ranks run in sessions of their own
            *_, pid, ticks = path.stem.split("-")
            if read_start_ticks(int(pid)) == int(ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)


def test_a_hung_gloo_job_pages_within_the_bound(venv: ArmedVenv, tmp_path: Path) -> None:
    flight = tmp_path / "flight"
    address = f"127.0.0.1:{services.free_port()}"
    rules = tmp_path / "rankscope.rules.yml"
    rules.write_text(render.rules_yaml({}))  # the shipped values
    daemon_log, job_log = tmp_path / "daemon.log", tmp_path / "job.log"
    webhook = Webhook()
    with open(daemon_log, "wb") as out:
        daemon = subprocess.Popen(
            [venv.python, "-m", "rankscope", "serve", f"--flight-dir={flight}",
             f"--web.listen-address={address}"],
            env=venv.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        services.wait_http(f"http://{address}/metrics", timeout=60, proc=daemon)
        with (
            services.alertmanager(tmp_path / "am", alertmanager_config(webhook.url)) as am,
            services.prometheus(
                tmp_path / "prom",
                scrape_targets=[address],
                rule_files=[rules],
                alertmanager_url=am.url,
            ) as prom,
        ):
            wait_for("the daemon scraped", prom.targets_up, 60, [daemon_log])
            with hung_job(venv, flight, job_log) as hang:
                assert hang.wait(300), job_log.read_text()[-3000:]
                started = time.monotonic()

                def paged() -> dict[tuple[str, str], dict]:
                    return {
                        (alert["labels"]["rank"], alert["labels"]["op"]): alert
                        for _, receiver, alert in webhook.firing()
                        if alert["labels"]["alertname"] == "RankscopeCensusHang"
                        and receiver == "rankscope-pager"
                        and alert["labels"]["group"] == "world:0-2"
                    }

                # Rank 2 is behind on all_reduce; ranks 0 and 1, on the all_gather it is in.
                pages = wait_for(
                    "RankscopeCensusHang paged for each rank behind",
                    lambda: len(got := paged()) == 3 and got,
                    BOUND_S,
                    [daemon_log, job_log],
                    lambda: f"{prom.query('ALERTS')}\n{paged()}",
                )
                print(f"hang start to pages: {time.monotonic() - started:.1f} s")
                assert set(pages) == {("2", "all_reduce"), ("0", "all_gather"), ("1", "all_gather")}
                alert = pages["2", "all_reduce"]
                assert alert["labels"]["severity"] == "critical"
                assert (
                    "Rank 2 is in world:0-2 all_gather #1." in alert["annotations"]["description"]
                )
    finally:
        services.stop(daemon)
        webhook.close()
