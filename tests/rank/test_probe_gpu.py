"""The probe on a real GPU: marks around real allocations, agreement with NVML, and a mark
before CUDA initialisation that binds no context.

Each test runs its CUDA work in a child process, so this pytest process never holds a
context (NVML, used here to watch the children, creates none). Needs one GPU; run with
`python3 -m pytest -m gpu tests/rank/test_probe_gpu.py`.
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

from rankscope.record import Mark, of_kind
from rankscope.record.reader import read_flight
from rankscope.reports.ledger import posts

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30


def child_env(flight: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "TORCHELASTIC"))}
    env.update(RANKSCOPE_DIR=str(flight), RANKSCOPE_BOOT_ID="gpu-test")
    return env


def run_child(code: str, flight: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(flight),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}


@pytest.fixture
def nvml() -> Iterator[Any]:
    import pynvml

    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def pids_on_any_card(nvml: Any) -> set[int]:
    pids = set()
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        pids |= {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    return pids


def test_a_mark_before_cuda_initialisation_binds_no_context(flight_dir: Path, nvml: Any) -> None:
    code = """
        import json, sys
        import torch
        from rankscope.rank import probe
        probe.mark("pre_weight_load")
        probe.mark("pre_weight_load_again")
        print(json.dumps({"initialised": torch.cuda.is_initialized()}), flush=True)
        sys.stdin.readline()
        torch.cuda.set_device(0)
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        probe.mark("first_allocation")
        print("allocated", flush=True)
        sys.stdin.readline()
    """
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(flight_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        assert json.loads(child.stdout.readline()) == {"initialised": False}
        assert child.pid not in pids_on_any_card(nvml), "a mark created a CUDA context"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "allocated"
        # The same check sees the context once the child really makes one.
        assert child.pid in pids_on_any_card(nvml)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    before, _, after = read_flight(flight_dir).records
    assert isinstance(before.body, Mark) and isinstance(after.body, Mark)
    assert before.body.torch.why == "CUDA not initialised in this process"
    assert before.body.torch.reserved is None and before.body.nvml.self_bytes is None
    assert (after.body.torch.reserved or 0) >= 4 * MiB
    assert (after.body.nvml.self_bytes or 0) > 0


ALLOCATIONS = """
    import json
    import torch
    from rankscope.rank import probe
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")  # the context and the allocator exist from here
    torch.cuda.synchronize()
    probe.mark("pre_weight_load")
    weights = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # 2 GiB of "weights"
    torch.cuda.synchronize()
    probe.mark("weights_loaded")

    static_in = torch.zeros(16 << 20, device="cuda")  # 64 MiB of float32
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            static_out = static_in * 2  # warm-up, as torch.cuda.graphs asks
    torch.cuda.current_stream().wait_stream(side)
    del static_out
    torch.cuda.synchronize()
    # torch.cuda.graph() empties the cache on entry: release the warm-up blocks first so
    # the capture post holds only what the capture itself takes.
    torch.cuda.empty_cache()
    probe.mark("capture_begin")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in * 2  # 64 MiB in the graph's private pool
    graph.replay()
    torch.cuda.synchronize()
    probe.mark("capture_end")
    print(json.dumps({"reserved": torch.cuda.memory_reserved()}))
"""


def test_posts_match_real_allocations(flight_dir: Path) -> None:
    result = run_child(ALLOCATIONS, flight_dir)
    records = read_flight(flight_dir).records
    marks = of_kind(records, Mark)
    by_phase = {r.body.phase: r.body for r in marks}
    assert by_phase["capture_end"].torch.reserved == result["reserved"]
    got = {p["post"]: p["views"] for p in posts(records)}

    weights = got["pre_weight_load->weights_loaded"]
    assert weights["allocated"] == 2 * GiB
    assert weights["allocator"] == 2 * GiB
    assert 2 * GiB <= weights["process"] <= 2 * GiB + 64 * MiB
    assert abs(weights["driver"] - 2 * GiB) <= 256 * MiB

    capture = got["capture_begin->capture_end"]
    assert capture["process"] >= 64 * MiB - 2 * MiB  # the graph's output lives on the card
    assert capture["non_torch"] == capture["process"] - capture["allocator"]

    for rec in marks:
        mark = rec.body
        assert mark.derived.non_torch_measured is True
        assert mark.nvml.self_bytes is not None and mark.torch.reserved is not None
        assert mark.derived.non_torch == mark.nvml.self_bytes - mark.torch.reserved
    # The CUDA context lives outside the allocator: the residue is measured, and positive here.
    non_torch = by_phase["pre_weight_load"].derived.non_torch
    assert non_torch is not None and non_torch > 0


AGREEMENT = """
    import json, os
    import pynvml
    import torch
    from rankscope.rank import probe
    from rankscope.rank.probe.nvml_view import _fast_process_lister, _public_processes
    torch.cuda.set_device(0)
    x = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    rec = probe.mark("weights_loaded")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(rec.device.uuid)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    fast = _fast_process_lister(pynvml)
    print(json.dumps({
        "mark": rec.to_json(),  # the record as it goes to disk
        "pid": os.getpid(),
        "nvml_procs": {str(p.pid): p.usedGpuMemory for p in procs},
        "free": info.free,
        "total": info.total,
        "index_uuid": pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(rec.device.nvml_index)),
        "fast": sorted(fast(handle)) if fast else None,
        "public": sorted(_public_processes(pynvml, handle)),
        "mem_get_info": list(torch.cuda.mem_get_info()),
    }))
"""


def test_the_driver_view_and_nvmls_process_list_agree_with_the_mark(flight_dir: Path) -> None:
    got = run_child(AGREEMENT, flight_dir)
    mark = got["mark"]
    assert mark["device"]["uuid"].startswith("GPU-")
    assert got["index_uuid"] == mark["device"]["uuid"]
    assert mark["nvml"]["procs"] == got["nvml_procs"]
    assert mark["nvml"]["self_bytes"] == got["nvml_procs"][str(got["pid"])]
    assert mark["nvml"]["self_bytes"] >= 256 * MiB
    assert mark["driver"]["total"] == got["total"]
    assert abs(mark["driver"]["free"] - got["free"]) <= 64 * MiB
    # CUDA's own view of the card tells the same story, short of the driver's reservation.
    assert abs(mark["driver"]["free"] - got["mem_get_info"][0]) <= GiB
    # The one-call process list reads what pynvml's wrapper reads.
    assert got["fast"] is not None, "pynvml no longer exposes what the fast process list uses"
    assert got["fast"] == got["public"]


def test_capture_end_reads_only_its_pools_snapshot(flight_dir: Path) -> None:
    """The generic capture_end mark sums its graph pool's bytes from a snapshot of that pool
    alone (the whole allocator's snapshot is what made it cost 8x a plain mark), and the sum
    equals the whole snapshot's for that pool."""
    out = run_child(
        """
        import json, torch
        from rankscope.rank import auto
        torch.cuda.set_device(0)
        other = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # the default pool
        graph, x = torch.cuda.CUDAGraph(), torch.zeros(1 << 20, device="cuda")
        with torch.cuda.graph(graph):
            y = x * 2
        fields = auto.pool_fields(torch, graph)
        pool = tuple(graph.pool())
        whole = auto.pool_bytes(torch.cuda.memory._snapshot()["segments"], pool)
        form = auto._pool_form
        used = auto.POOL_SNAPSHOT_FORMS.index(form) if form in auto.POOL_SNAPSHOT_FORMS else None
        print(json.dumps({"fields": fields.to_json(), "whole": whole, "form": used,
                          "torch": torch.__version__}))
        """,
        flight_dir,
    )
    print(out)
    assert out["form"] is not None, out  # this torch takes one pool's snapshot
    assert out["fields"]["pool_why"] is None, out
    assert out["fields"]["pool_bytes"] == out["whole"] > 0, out


def test_a_serving_sample_reads_the_ranks_card_not_card_0(flight_dir: Path, nvml: Any) -> None:
    """CUDA's current device is per thread: the sampler's thread, which never sets one, reads
    the card of the rank's last mark. Needs two cards (on one, both are card 0)."""
    if nvml.nvmlDeviceGetCount() < 2:
        pytest.skip("needs two GPUs")
    got = run_child(
        """
        import json, threading, torch
        from rankscope.rank import probe
        from rankscope.rank.probe import samples
        torch.cuda.set_device(1)
        x = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
        rec = probe.mark("weights_loaded")
        taken = []
        sampler = threading.Thread(target=lambda: taken.append(samples.take()))
        sampler.start()
        sampler.join()
        print(json.dumps({"mark": rec.to_json(), "sample": taken[0].to_json()}))
        """,
        flight_dir,
    )
    mark, sample = got["mark"], got["sample"]
    assert mark["device"]["index"] == sample["device"]["index"] == 1
    assert sample["device"]["uuid"] == mark["device"]["uuid"]
    assert sample["torch"]["reserved"] == mark["torch"]["reserved"] >= 64 * MiB
    assert sample["nvml"]["self_bytes"] is not None and sample["nvml"]["self_bytes"] > 0


@pytest.mark.parametrize("select", ["torch.cuda.set_device(1)", "torch.cuda.device(1).__enter__()"])
def test_the_cuda_init_of_a_device_selection_reads_the_card_being_selected(
    flight_dir: Path, nvml: Any, select: str
) -> None:
    """torch.cuda.set_device(1) and `with torch.cuda.device(1)` initialise CUDA before they
    set the device: the generic cuda_init mark made there reads card 1, as the rank's later
    marks do. Needs two cards."""
    if nvml.nvmlDeviceGetCount() < 2:
        pytest.skip("needs two GPUs")
    code = f"""
        from rankscope.rank import auto
        assert auto.arm()
        import torch
        {select}
        x = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
        from rankscope.rank import probe
        probe.mark("weights_loaded")
        """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**child_env(flight_dir), "RANKSCOPE_AUTO": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    marks = {m.body.phase: m.body for m in of_kind(read_flight(flight_dir).records, Mark)}
    cuda_init, weights = marks["cuda_init"], marks["weights_loaded"]
    assert cuda_init.device.index == weights.device.index == 1, (cuda_init, weights)
    assert cuda_init.device.uuid == weights.device.uuid
