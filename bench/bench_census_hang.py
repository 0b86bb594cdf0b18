"""Time from a hang's start to its name, and from a rank's SIGKILL to its name as dead, by
`rankscope census` and by the daemon's /metrics.

A real job under `rankscope run -- torchrun` (three gloo ranks, tests/programs/census_faults.py):
rank 2 skips its 6th all_reduce and all-gathers, and prints its fault line just before; the
hang starts then (ranks 0 and 1 are in all_reduce #6 within a step). From that line, the CLI
(`rankscope census DIR --json`, run back to back) and /metrics (scraped every 250 ms) are
polled until they name every rank stalled and rank 2 behind on all_reduce. Then a healthy
job: once its ranks run, rank 1 is SIGKILLed, and both are polled until they name it dead.
Run from a venv that holds rankscope-auto.pth (a pip install of rankscope).

    python3 bench/bench_census_hang.py [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "programs" / "census_faults.py"
FAULT = ("--fault", "skip-hang", "--rank", "2", "--step", "5", "--steps", "40")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_names_it(flight: Path) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "rankscope", "census", str(flight), "--json"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 1:
        return False
    doc = json.loads(done.stdout)
    stalled = [r["state"] for r in doc["ranks"]] == ["stalled"] * 3
    return stalled and any(e["lagging"] == [2] for e in doc["latest"])


def metrics_name_it(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    stalled = sum(
        1
        for line in text.splitlines()
        if line.startswith("rankscope_census_rank_state{")
        and 'state="stalled"' in line
        and line.endswith(" 1.0")
    )
    behind = any(
        line.startswith("rankscope_census_latest_deficit{") and 'rank="2"' in line
        for line in text.splitlines()
    )
    return stalled == 3 and behind


def cli_doc(flight: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "rankscope", "census", str(flight), "--json"],
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout) if done.returncode in (0, 1) else {}


def cli_names_dead(flight: Path) -> bool:
    return [r["state"] for r in cli_doc(flight).get("ranks", [])][1:2] == ["dead"]


def metrics_name_dead(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return any(
        line.startswith("rankscope_census_rank_state{")
        and 'rank="1"' in line
        and 'state="dead"' in line
        and line.endswith(" 1.0")
        for line in text.splitlines()
    )


def start(flight: Path, port: int, *args: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    daemon = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "serve", f"--flight-dir={flight}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    job = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "run", "--dir", str(flight), "--", "torchrun",
         "--nproc-per-node", "3", "--master-port", str(free_port()), str(PROGRAM), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"),
    )  # fmt: skip
    return daemon, job


def stop_all(flight: Path, daemon: subprocess.Popen, job: subprocess.Popen) -> None:
    for path in flight.glob("census-*.jsonl"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(path.stem.split("-")[-2]), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait(60)
    daemon.terminate()
    daemon.wait(30)


def until_both(cli_check: Any, metrics_check: Any, since: float) -> tuple[float, float]:
    cli = metrics = None
    while cli is None or metrics is None:
        if metrics is None and metrics_check():
            metrics = time.monotonic() - since
        if cli is None and cli_check():
            cli = time.monotonic() - since
        time.sleep(0.05)
    return cli, metrics


def hang_run(work: Path) -> tuple[float, float]:
    flight, port = work / "flight", free_port()
    daemon, job = start(flight, port, *FAULT)
    started = threading.Event()
    hang_at: list[float] = []

    def read() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            if line.startswith("fault skip-hang"):
                hang_at.append(time.monotonic())
                started.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        while not started.wait(1.0):
            if job.poll() is not None:
                raise RuntimeError(f"the job ended ({job.returncode}) before its fault")
        url = f"http://127.0.0.1:{port}/metrics"
        return until_both(lambda: cli_names_it(flight), lambda: metrics_name_it(url), hang_at[0])
    finally:
        stop_all(flight, daemon, job)


def dead_run(work: Path) -> tuple[float, float]:
    flight, port = work / "flight", free_port()
    daemon, job = start(flight, port, "--steps", "4000")
    threading.Thread(target=lambda: job.communicate(), daemon=True).start()
    try:
        while [r["state"] for r in cli_doc(flight).get("ranks", [])] != ["running"] * 3:
            if job.poll() is not None:
                raise RuntimeError(f"the job ended ({job.returncode})")
            time.sleep(0.5)
        os.kill(cli_doc(flight)["ranks"][1]["pid"], signal.SIGKILL)
        killed = time.monotonic()
        url = f"http://127.0.0.1:{port}/metrics"
        return until_both(lambda: cli_names_dead(flight), lambda: metrics_name_dead(url), killed)
    finally:
        stop_all(flight, daemon, job)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for what, run in (("hang start", hang_run), ("SIGKILL", dead_run)):
        clis, scrapes = [], []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as work:
                cli, metrics = run(Path(work))
            clis.append(cli)
            scrapes.append(metrics)
            print(
                f"{what} run {i + 1}: named by the CLI after {cli:.2f} s, /metrics {metrics:.2f} s"
            )
        print(
            f"{args.runs} runs, {what} to name: CLI median {statistics.median(clis):.2f} s "
            f"(max {max(clis):.2f}), /metrics median {statistics.median(scrapes):.2f} s "
            f"(max {max(scrapes):.2f}); stall time 1 s"
        )


if __name__ == "__main__":
    main()
