"""On a real GPU: a rank process allocates through torch and marks a phase with the probe;
`rankscope serve` (NVML source) publishes the allocator figures the rank itself read, the
NVML bytes of that process, and the card's identity, in an exposition both parsers accept.

Runs standalone: `python3 -m pytest -m gpu tests/daemon/test_daemon_gpu.py` with torch and the
package installed, no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_serve import get, serve, stop_processes

RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from rankscope.rank import probe
    torch.cuda.set_device(0)
    block = torch.empty(768 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    probe.mark("weights_loaded")
    print(json.dumps({
        "reserved": torch.cuda.memory_reserved(0),
        "allocated": torch.cuda.memory_allocated(0),
    }), flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.gpu
def test_a_real_rank_on_a_gpu_shows_with_its_own_figures(flight_dir: Path, tmp_path: Path) -> None:
    env = dict(
        os.environ,
        RANKSCOPE_DIR=str(flight_dir),
        RANKSCOPE_BOOT_ID="gpu-boot",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
    )
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK_SCRIPT],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert rank.stdout is not None
        seen = json.loads(rank.stdout.readline())
        with serve(flight_dir, "--holdings.interval=200ms", log=tmp_path / "serve.log") as url:
            deadline = time.monotonic() + 30
            while True:
                text = get(url + "/metrics")[2].decode()
                samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
                holdings = [
                    s
                    for s in samples
                    if s.name == "rankscope_gpu_process_bytes" and s.labels["pid"] == str(rank.pid)
                ]
                if holdings:
                    break
                assert time.monotonic() < deadline, f"the rank's holding never showed:\n{text}"
                time.sleep(0.3)

            def one(name: str) -> tuple[dict[str, str], float]:
                (s,) = [s for s in samples if s.name == name and s.labels.get("boot") == "gpu-boot"]
                return s.labels, s.value

            labels, reserved = one("rankscope_phase_reserved_bytes")
            assert reserved == seen["reserved"] and reserved >= 768 << 20
            assert one("rankscope_phase_allocated_bytes")[1] == seen["allocated"]
            assert labels["pid"] == str(rank.pid) and labels["rank"] == "0"
            # NVML's bytes for this process hold at least what the allocator reserved.
            process_bytes = one("rankscope_phase_process_bytes")[1]
            assert process_bytes >= reserved
            assert one("rankscope_phase_non_torch_bytes")[1] == process_bytes - reserved
            # The card the mark names is a card the daemon samples, by NVML index and uuid.
            cards = {
                (s.labels["gpu"], s.labels["uuid"])
                for s in samples
                if s.name == "rankscope_gpu_total_bytes"
            }
            assert (labels["gpu"], labels["uuid"]) in cards
            (holding,) = holdings
            assert holding.labels["role"] == "rank" and holding.labels["rank"] == "0"
            up = {s.labels["source"]: s.value for s in samples if s.name == "rankscope_up"}
            assert up == {"flight": 1.0, "nvml": 1.0}
            om = get(url + "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})[2]
            assert {f.name for f in openmetrics_families(om.decode())} >= {
                "rankscope_phase_reserved_bytes",
                "rankscope_gpu_free_bytes",
                "rankscope_gpu_process_bytes",
            }
    finally:
        stop_processes([rank])


@pytest.mark.gpu
def test_a_daemon_reading_nvml_serves_the_card_in_both_formats(flight_dir: Path) -> None:
    """A default daemon on the NVML source serves the card's series in the text format and
    in OpenMetrics, with NVML loaded into the daemon itself."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "serve", f"--flight-dir={flight_dir}",
         "--device.source=nvml", "--web.listen-address=127.0.0.1:0"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        started = next((line for line in proc.stderr if "serving on" in line), "")
        assert started, f"rankscope serve exited {proc.wait()} without serving"
        url = started.split("serving on ")[1].split("/metrics")[0]
        for accept in ("", "application/openmetrics-text"):
            deadline = time.monotonic() + 15  # the card's series appear at its first sample
            while True:
                status, _headers, body = get(url + "/metrics", {"Accept": accept})
                if b"rankscope_gpu_free_bytes{" in body or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == 200 and b"rankscope_gpu_free_bytes{" in body
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libnvidia-ml.so" in maps
    finally:
        proc.terminate()
        proc.wait(timeout=20)
