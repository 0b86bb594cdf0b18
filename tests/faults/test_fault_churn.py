"""Pid churn within one boot: many short real probe processes. Their series go once they
have been gone for the grace (--flight.exited-grace), a live process's stay, and every
record file stays (the API, which reads the files, still shows each process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from fault_daemon import daemon, run_rank

BOOT = "boot-churn"
LIVE = textwrap.dedent(
    """
    import sys
    from rankscope.rank import probe
    probe.configure(tp_rank=0, pp_rank=0, runner="target")
    probe.mark("live_phase")
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def pids_published(text: str) -> set[str]:
    return {
        line.split('pid="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("rankscope_phase_timestamp_seconds{") and f'boot="{BOOT}"' in line
    }


def test_series_of_exited_processes_go_and_their_files_stay(
    flight_dir: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env.update(RANKSCOPE_DIR=str(flight_dir), RANKSCOPE_BOOT_ID=BOOT)
    live = subprocess.Popen(
        [sys.executable, "-c", LIVE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == b"ready"
        with daemon(flight_dir, tmp_path, "--flight.exited-grace=2s") as d:
            for _ in range(6):
                run_rank(flight_dir, BOOT, 2)  # short processes, one after the other
            assert len(pids_published(d.metrics())) == 7  # just exited: still in the grace
            deadline = time.monotonic() + 30
            while (published := pids_published(d.metrics())) != {str(live.pid)}:
                assert time.monotonic() < deadline, published
                time.sleep(0.5)
            assert len(list(flight_dir.iterdir())) == 7  # the record files stay
            status, body = d.get(f"/api/v1/phases?boot={BOOT}")
            assert status == 200 and len(json.loads(body)["processes"]) == 7
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait(timeout=30)
