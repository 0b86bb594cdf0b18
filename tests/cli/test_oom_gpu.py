"""The OOM instant on a real GPU (marker gpu; skipped where there is none).

A real foreign process (a python named `squatter`) holds all but ~2 GiB of the card's free
memory; a real rank process armed by RANKSCOPE_DIR then asks torch for more than is free, in
three ways: after a mark, inside a CUDA graph capture, and without ever marking (the probe
imported before torch, attached by its torch.cuda import watch). Each time:

- the rank's own torch.OutOfMemoryError reaches its code: same type, same message as the
  same script run unarmed (the probe did not swallow or replace it);
- the oom line exists, and `rankscope oom` names the foreign pid and its comm, with its
  bytes within 1% of what nvidia-smi reports for that pid;
- a real `rankscope serve` on NVML counts it in rankscope_oom_events_total.

Run with -s to see the figures (docs/performance.md quotes them); with OUT set they are also
appended to $OUT/oom_gpu.txt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_serve import get, serve

from support.waiting import wait_for

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
MiB = 1 << 20
LEAVE_FREE = 2 * GiB

FOREIGN = textwrap.dedent(
    """
    import sys
    # The kernel's comm, what NVML's holders are named by: set before the context exists.
    with open("/proc/self/comm", "w") as comm:
        comm.write("squatter")
    import torch
    free, _ = torch.cuda.mem_get_info()
    block = torch.empty(free - int(sys.argv[1]), dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    print(block.numel(), flush=True)
    sys.stdin.read()
    """
)

RANK = textwrap.dedent(
    """
    import sys
    mode = sys.argv[1]
    if mode == "nomark":
        from rankscope.rank import probe  # armed before torch is imported; never marks
    import torch
    from rankscope.rank import probe
    torch.zeros(1, device="cuda")
    if mode != "nomark":
        probe.mark("kv_pool_sized")
    free, _ = torch.cuda.mem_get_info()
    ask = free + (4 << 30)
    caught = None
    if mode == "graph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            try:
                torch.empty(ask, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as exc:
                caught = exc
    else:
        try:
            torch.empty(ask, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            caught = exc
    if caught is None:
        print("NO-OOM", flush=True)
        sys.exit(3)
    print("TYPE", type(caught).__module__ + "." + type(caught).__qualname__)
    print("MESSAGE", str(caught).split(" GiB")[0].split(" MiB")[0].rsplit(" ", 1)[0])
    print("FULL", str(caught).splitlines()[0])
    print("ATTACHED", probe.oom.STATE.attached, probe.oom.STATE.why)
    """
)


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env.update(PYTHONPATH=str(REPO / "exporter"), **extra)
    return env


@pytest.fixture(scope="module")
def squatter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """(pid, bytes it allocated): a real process named `squatter` holding the card."""
    # Not a symlink to the interpreter: a venv's python behind a symlink loses its venv.
    proc = subprocess.Popen(
        [sys.executable, "-c", FOREIGN, str(LEAVE_FREE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with(),
    )
    assert proc.stdout is not None and proc.stdin is not None
    held = int(proc.stdout.readline())
    try:
        yield proc.pid, held
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("oom-gpu")
    flight_dir = root / "flight"
    flight_dir.mkdir()
    with serve(
        flight_dir,
        "--device.source=nvml",
        "--sampler.interval=100ms",
        log=root / "serve.log",
        env=env_with(),
    ) as url:
        yield url, flight_dir


def run_rank(mode: str, env: dict[str, str]) -> tuple[int, dict[str, str]]:
    done = subprocess.run(
        [sys.executable, "-c", RANK, mode], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    return done.returncode, out


def smi_bytes(pid: int) -> int:
    rows = subprocess.run(
        [
            "nvidia-smi",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for row in rows:
        p, mib = (x.strip() for x in row.split(","))
        if int(p) == pid:
            return int(mib) * MiB
    raise AssertionError(f"nvidia-smi does not list pid {pid}: {rows}")


def oom_counter(url: str) -> dict[str, float]:
    _, _, body = get(url + "/metrics")
    return {
        s.labels["pid"]: s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
        if s.name == "rankscope_oom_events_total"
    }


@pytest.mark.parametrize("mode", ["mark", "graph", "nomark"])
def test_gpu_oom_names_the_foreign_holder_and_leaves_the_error_alone(
    mode: str, squatter: tuple[int, int], daemon: tuple[str, Path]
) -> None:
    foreign_pid, foreign_held = squatter
    url, flight_dir = daemon
    boot = f"gpu-oom-{mode}"

    _, bare = run_rank(mode, env_with())
    _, armed = run_rank(mode, env_with(RANKSCOPE_DIR=str(flight_dir), RANKSCOPE_BOOT_ID=boot))
    # The rank's own error, unchanged by the probe.
    assert armed["TYPE"] == bare["TYPE"] == "torch.OutOfMemoryError"
    assert armed["MESSAGE"] == bare["MESSAGE"]
    assert armed["MESSAGE"].startswith("CUDA out of memory. Tried to allocate")
    assert armed["ATTACHED"].startswith("True"), armed

    cli = subprocess.run(
        [sys.executable, "-m", "rankscope", "oom", str(flight_dir), "--boot", boot, "--json"],
        env=env_with(),
        capture_output=True,
        text=True,
        check=True,
    )
    events: list[dict[str, Any]] = json.loads(cli.stdout)["ooms"]
    assert events, f"no oom line for boot {boot}"
    event = events[-1]
    foreign = next(h for h in event["holders"] if h["pid"] == foreign_pid)
    assert foreign["role"] == "foreign" and foreign["comm"] == "squatter"
    smi = smi_bytes(foreign_pid)
    diff = (foreign["bytes"] - smi) / smi
    assert abs(diff) <= 0.01, (foreign["bytes"], smi)
    assert event["requested"] is not None and event["free"] is not None
    assert f"{event['requested'] / GiB:.2f} GiB" in armed["FULL"]
    if mode == "graph":
        assert event["capturing"] is True
    if mode == "nomark":
        assert event["phase"] is None
    else:
        assert event["phase"] == "kv_pool_sized"
    text = subprocess.run(
        [sys.executable, "-m", "rankscope", "oom", str(flight_dir), "--boot", boot],
        env=env_with(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"{foreign_pid} squatter foreign" in text

    rank_pid = str(event["host_pid"] or event["pid"])
    moved = wait_for(lambda: oom_counter(url).get(rank_pid), timeout=20, what="counter moved")
    figures = (
        f"\n[oom-gpu] mode={mode} requested={event['requested']} free_at_oom={event['free']} "
        f"reserved={event['reserved']} largest_free_block={event['largest_free_block']} "
        f"pools={event['pools']} foreign pid={foreign_pid} comm={foreign['comm']} "
        f"oom_line_bytes={foreign['bytes']} nvidia_smi_bytes={smi} diff={diff:+.4%} "
        f"(squatter allocated {foreign_held}) daemon_counter={moved:g}\n{text.strip()}\n"
    )
    print(figures)
    if os.environ.get("OUT"):  # scripts/gpu-tests.sh's result directory
        with open(Path(os.environ["OUT"]) / "oom_gpu.txt", "a") as f:
            f.write(figures)
