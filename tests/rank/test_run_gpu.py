"""`rankscope run` on an unmodified transformers script on a real GPU (marker gpu): a
LLaMA-style model from a config with random weights, generating with a static KV cache,
eagerly and then under CUDA graphs (torch.compile mode="reduce-overhead"), in
tests/programs/llama_generate.py, which imports nothing from rankscope.

The ledger must show the CUDA context (the cuda_init mark), the weights (the post from the
context to the first capture), the graph captures with their pool's bytes, and the
process's bytes equal to nvidia-smi's for the same pid. Figures are printed, and written as
JSON under $RANKSCOPE_GPU_OUT when set. Skips where there is no GPU or no transformers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.armed_venv import make_armed_venv

from rankscope.record import Mark, PoolFields, Sample, of_kind
from rankscope.record.reader import read_flight

# Compiling the decode step (Inductor) takes minutes on a cold cache.
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

PROGRAM = Path(__file__).parents[1] / "programs" / "llama_generate.py"
MiB = 1 << 20


def smi_used_mib(pid: int) -> int | None:
    """nvidia-smi's used memory of ``pid`` in MiB; None while it is not listed."""
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    for line in done.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1])
    return None


def test_llama_generation_ledger_under_rankscope_run(tmp_path: Path) -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    venv = make_armed_venv(tmp_path / "venv")
    flight = tmp_path / "flight"
    proc = subprocess.Popen(
        venv.run_under_rankscope(flight, venv.python, str(PROGRAM)),
        env=venv.env(RANKSCOPE_SAMPLE_EVERY="0.5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    readings: list[tuple[float, int]] = []  # (wall, MiB) of the script's pid: exec keeps it

    def poll() -> None:
        while proc.poll() is None:
            used = smi_used_mib(proc.pid)
            if used is not None:
                readings.append((time.time(), used))
            time.sleep(0.25)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out, err = proc.communicate(timeout=900)
    poller.join(10)
    assert proc.returncode == 0, err[-4000:]
    params = int(re.search(r"parameters: (\d+) bytes", out).group(1))  # type: ignore[union-attr]

    records = read_flight(flight).records
    marks = [m.body for m in of_kind(records, Mark) if m.header.pid == proc.pid]
    samples = [
        (s.header.wall, s.body) for s in of_kind(records, Sample) if s.header.pid == proc.pid
    ]
    phases = [m.phase for m in marks]
    assert phases[0] == "process_start" and phases[-1] == "process_exit", phases
    assert phases.count("cuda_init") == 1, phases
    cuda_init = marks[phases.index("cuda_init")]
    assert cuda_init.device.uuid, cuda_init  # the card is known from this mark on
    captures = [m for m in marks if m.phase == "capture_end"]
    assert captures, phases
    bad: list[str] = []
    pools = [PoolFields.parse(c.extra, bad) for c in captures if isinstance(c.extra, dict)]
    assert len(pools) == len(captures) and bad == [], (bad, [c.extra for c in captures])
    assert phases.index("cuda_init") < phases.index("capture_begin")
    # Every capture reads its pool; the graphs of one compiled model share one pool, which
    # may still be empty at the end of the first capture (seen on the H200: 0, with the
    # pools that did hold segments in pool_why) and holds the graphs' memory by the last.
    assert all(p.pool_bytes is not None for p in pools), pools
    assert all(p.pool_why for p in pools if p.pool_bytes == 0), pools
    assert (pools[-1].pool_bytes or 0) > 0, pools
    first_capture = marks[phases.index("capture_begin")]
    assert first_capture.torch.reserved is not None
    weights_reserved = first_capture.torch.reserved - (cuda_init.torch.reserved or 0)
    assert weights_reserved >= params  # the weights are in the span, with the KV cache
    if cuda_init.nvml.self_bytes is None or first_capture.nvml.self_bytes is None:
        pytest.skip(f"NVML cannot see this process's bytes: {cuda_init.nvml.why}")
    weights_process = first_capture.nvml.self_bytes - cuda_init.nvml.self_bytes
    assert weights_process >= params

    # The process's bytes as the probe read them equal nvidia-smi's for the same pid: the
    # last sample before the script's closing pause against smi's reading in that pause.
    if not readings:
        pytest.skip(f"nvidia-smi never listed pid {proc.pid}: no host PID view here")
    last_wall, last_smi = readings[-1]
    before = [s for wall, s in samples if wall <= last_wall]
    assert before, "no serving sample before nvidia-smi's last reading"
    probe_bytes, exit_bytes = before[-1].nvml.self_bytes, marks[-1].nvml.self_bytes
    assert probe_bytes is not None and exit_bytes is not None
    probe_mib, exit_mib = probe_bytes // MiB, exit_bytes // MiB

    figures: dict[str, Any] = {
        "device": cuda_init.device.to_json(),
        "parameters_bytes": params,
        "process_start_nvml_self_bytes": marks[0].nvml.self_bytes,
        "cuda_init_nvml_self_bytes": cuda_init.nvml.self_bytes,
        "cuda_init_driver_used_bytes": cuda_init.driver.used,
        "weights_span_reserved_bytes": weights_reserved,
        "weights_span_process_bytes": weights_process,
        "captures": len(captures),
        "pool_bytes_per_capture": [p.pool_bytes for p in pools],
        "process_bytes_at_exit": exit_bytes,
        "reserved_at_exit": marks[-1].torch.reserved,
        "non_torch_at_exit": marks[-1].derived.non_torch,
        "samples": len(samples),
        "nvidia_smi_last_mib": last_smi,
        "probe_last_sample_mib": probe_mib,
        "probe_exit_mib": exit_mib,
        "script_stdout": out.splitlines(),
        "phases": phases,
    }
    print(json.dumps(figures, indent=2))
    if os.environ.get("RANKSCOPE_GPU_OUT"):
        target = Path(os.environ["RANKSCOPE_GPU_OUT"])
        target.mkdir(parents=True, exist_ok=True)
        (target / "test_run_gpu.json").write_text(json.dumps(figures, indent=2) + "\n")
    # smi prints whole MiB of the same NVML figure the probe reads in bytes.
    assert abs(probe_mib - last_smi) <= 1, figures
    assert abs(exit_mib - last_smi) <= 1, figures
