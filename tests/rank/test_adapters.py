"""The SGLang and vLLM adapters attaching to STAND-IN framework packages (tests/standins/,
shaped like the manifest of the real wheels) during a fake two-rank boot over real
torch.distributed (gloo), read back from the flight record as the CLI reads it.

The stand-ins are not SGLang or vLLM: they have the real module paths, class and method
names and the parameters the adapters read (checked here against the manifest), and bodies
that only boot a toy job. The version under test comes from a generated dist-info."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from tests.support.services import free_port

from rankscope.rank.adapters import ADAPTERS
from rankscope.rank.adapters.common import group_of
from rankscope.rank.adapters.manifest import check_point, extract, module_path, wanted
from rankscope.record import AdapterFailure, AdapterStatus, Mark, of_kind
from rankscope.record.reader import read_flight
from rankscope.reports.census import census_document

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tests" / "standins" / "packages"
BOOT = ROOT / "tests" / "standins" / "boot.py"
BY_NAME = {a.framework: a for a in ADAPTERS}
WORLD = 2
# What the fake job prints on each rank: the checksum of its last forward, all-reduced over
# the TP group (the test of an unknown version shows it is the output without rankscope).
JOB_OUTPUT = "standin job rank {rank}: checksum 32768.0\n"


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.framework)
def test_standins_have_the_shape_of_the_manifest(adapter):
    """Every hook point the manifest holds from the real wheels (test_adapters_manifest) is in
    the stand-in too, with the parameters the adapter reads at the same positions."""
    problems = []
    for module, (members, functions) in wanted(adapter).items():
        path = STANDINS / module_path(module)
        standin = extract(path.read_text(), members, functions) if path.exists() else None
        for point in (p for p in adapter.points if p.module == module):
            if point.optional and standin is None:
                continue  # read with a fallback: the stand-in plays a version without it
            problems += check_point(point, standin)
    assert problems == []


def _site(tmp_path: Path, framework: str, version: str, tree: Path = STANDINS) -> Path:
    site = tmp_path / "site"
    info = site / f"{framework}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {framework}\nVersion: {version}\n"
    )
    shutil.copytree(tree / framework, site / framework)
    return site


def _site_env(site: Path, flight: Path) -> dict[str, str]:
    """This environment, importing the stand-in ``site`` and rankscope, recording to ``flight``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "exporter")]),
        "RANKSCOPE_DIR": str(flight),
        "PYTHONWARNINGS": "ignore",
    }


def _run_hooked(site: Path, flight: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter against the stand-in ``site``; it must exit 0."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_site_env(site, flight),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out


def _boot(
    tmp_path: Path,
    framework: str,
    site: Path,
    *,
    adapters: bool = True,
    steps: int = 4,
    extra_env: dict[str, str] | None = None,
):
    """Run the fake boot as WORLD real processes; (flight dir, {rank: stdout}, {rank: rc})."""
    flight = tmp_path / ("flight" if adapters else "flight-off")
    env = {
        **(extra_env or {}),
        **_site_env(site, flight),
        "RANKSCOPE_BOOT_ID": f"standin-{framework}",
        "RANKSCOPE_CENSUS_EVERY": "1",
        "STANDIN_ADAPTERS": "1" if adapters else "0",
    }
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # SGLang and vLLM ranks start without
        env.pop(name, None)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(BOOT), framework, str(rank), str(WORLD), str(port), str(steps)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outs, rcs = {}, {}
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outs[rank], rcs[rank] = out, proc.returncode
    return flight, outs, rcs


def _job_output(out: str) -> str:
    return "".join(line for line in out.splitlines(True) if not line.startswith("WRAPPED "))


def _wrapped(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("WRAPPED "))
    return json.loads(line.removeprefix("WRAPPED "))


def _adapter_lines(records):
    return of_kind(records, AdapterStatus)


def _phases(records, pid):
    return [(m.header.runner, m.body.phase) for m in of_kind(records, Mark) if m.header.pid == pid]


def _dump_counts(doc):
    return {(e["group"], e["op"]): e["counts"] for e in doc["dumps"]["entries"]}


def test_sglang_adapter_marks_arenas_and_census_through_standins(tmp_path):
    site = _site(tmp_path, "sglang", "0.5.23")
    flight, outs, _ = _boot(tmp_path, "sglang", site)
    records = read_flight(flight).records
    for rank in range(WORLD):
        assert _job_output(outs[rank]) == JOB_OUTPUT.format(rank=rank)
    pids = sorted({r.header.pid for r in records})
    assert len(pids) == WORLD
    lines = _adapter_lines(records)
    assert [(a.header.pid, a.body.status, a.body.framework, a.body.version) for a in lines] == [
        (pid, "attached", "sglang", "0.5.23") for pid in sorted(a.header.pid for a in lines)
    ]
    assert len(lines) == WORLD
    assert "sglang.srt.managers.scheduler:Scheduler.ingest_requests" in lines[0].body.hooks
    for pid in pids:
        # Target and draft runners through the same phases; the draft's marks say so.
        assert _phases(records, pid) == [
            ("target", "pre_weight_load"),
            ("target", "weights_loaded"),
            ("draft", "pre_weight_load"),
            ("draft", "weights_loaded"),
            ("target", "kv_pool_sized"),
            ("draft", "kv_pool_sized"),
            ("target", "capture_begin"),
            ("target", "capture_end"),
            ("draft", "capture_begin"),
            ("draft", "capture_end"),
            ("target", "first_forward"),
            ("target", "boot_complete"),
        ]
    marks = of_kind(records, Mark)
    # Ranks from SGLang's own groups: the environment had no RANK.
    assert sorted({(m.header.rank, m.header.tp_rank, m.header.pp_rank) for m in marks}) == [
        (0, 0, 0),
        (1, 1, 0),
    ]
    last = marks[-1]
    # K + V of 2 layers x tokens x 2 heads x 8 dims x 2 bytes (float16)
    kv, kv_draft = last.body.arenas["kv"], last.body.arenas["kv_draft"]
    assert kv.reserved == 2 * 2 * 512 * 2 * 8 * 2
    assert kv.backed == kv.reserved
    assert kv.retained is None
    assert kv_draft.reserved == 2 * 2 * 128 * 2 * 8 * 2
    doc = census_document(read_flight(flight))
    # all_reduce: 2 captures x 2 runners + 1 loop batch + 1 final batch; each call crosses
    # the coordinator, the custom-op function, the private method and torch.distributed
    # (instrumented too) and counts once. broadcast: one per scheduler iteration.
    assert _dump_counts(doc) == {
        ("tp:0-1", "all_reduce"): {"0": 6, "1": 6},
        ("tp:0-1", "broadcast"): {"0": 4, "1": 4},
    }
    assert doc["ranks"][0]["snapshots"] == 4  # one tick per scheduler iteration


def test_vllm_adapter_marks_arenas_and_census_through_standins(tmp_path):
    site = _site(tmp_path, "vllm", "0.33.0")
    flight, outs, _ = _boot(tmp_path, "vllm", site, steps=3)
    records = read_flight(flight).records
    for rank in range(WORLD):
        assert _job_output(outs[rank]) == JOB_OUTPUT.format(rank=rank)
    lines = _adapter_lines(records)
    assert len(lines) == WORLD and {a.body.status for a in lines} == {"attached"}
    # The device communicator module comes mid-boot (imported by the coordinator).
    assert lines[0].body.pending == ("vllm.distributed.device_communicators.cuda_communicator",)
    assert (
        "vllm.distributed.device_communicators.cuda_communicator:CudaCommunicator.broadcast"
        in _wrapped(outs[0])
    )
    for pid in {r.header.pid for r in records}:
        assert _phases(records, pid) == [
            ("target", phase)
            for phase in (
                "pre_weight_load",
                "weights_loaded",
                "kv_pool_sized",
                "capture_begin",
                "capture_end",
                "first_forward",
                "boot_complete",
            )
        ]
    marks = of_kind(records, Mark)
    assert sorted({(m.header.rank, m.header.tp_rank, m.header.pp_rank) for m in marks}) == [
        (0, 0, 0),
        (1, 1, 0),
    ]
    kv = marks[-1].body.arenas["kv"]
    assert (kv.reserved, kv.backed, kv.retained) == (2 << 20, 2 << 20, None)
    doc = census_document(read_flight(flight))
    # all_reduce: 2 warm-up forwards + 3 steps, through the coordinator's private method and
    # its device communicator, once each; broadcast: 3 direct device communicator calls.
    assert _dump_counts(doc) == {
        ("tp:0-1", "all_reduce"): {"0": 5, "1": 5},
        ("tp:0-1", "broadcast"): {"0": 3, "1": 3},
    }
    assert doc["ranks"][0]["snapshots"] == 3  # one tick per engine step


CHECKED_ONLY = {"RANKSCOPE_ADAPTERS": "checked-only"}


def test_checked_only_leaves_an_unknown_version_one_line_and_an_untouched_job(tmp_path):
    site = _site(tmp_path, "sglang", "0.4.0")
    flight, outs, _ = _boot(tmp_path, "sglang", site, extra_env=CHECKED_ONLY)
    _, baseline, _ = _boot(tmp_path, "sglang", site, adapters=False)
    records = read_flight(flight).records
    for rank in range(WORLD):
        # The job's output is what it prints without rankscope at all.
        assert _job_output(outs[rank]) == _job_output(baseline[rank])
        assert _job_output(baseline[rank]) == JOB_OUTPUT.format(rank=rank)
        assert _wrapped(outs[rank]) == []
    lines = _adapter_lines(records)
    assert len(lines) == WORLD  # one a process
    for line in lines:
        assert line.body.status == "not_attached"
        assert line.body.version == "0.4.0"
        assert line.body.failed is not None and line.body.failed.why == (
            "sglang 0.4.0 is not a checked version (RANKSCOPE_ADAPTERS=checked-only)"
        )
        assert line.body.hooks == ()
    assert of_kind(records, Mark) == []
    # Only the generic torch.distributed layer counted: no coordinator group instance.
    assert all(group != "tp:0-1" for group, _ in _dump_counts(census_document(read_flight(flight))))


def test_a_next_release_with_every_hook_point_attaches_as_unverified(tmp_path):
    """A synthetic "next release": the same source under a version no one checked. Every hook
    point verifies in its installed source, so it attaches, and says it is unverified."""
    site = _site(tmp_path, "sglang", "0.5.24")
    flight, outs, _ = _boot(tmp_path, "sglang", site)
    records = read_flight(flight).records
    for rank in range(WORLD):
        assert _job_output(outs[rank]) == JOB_OUTPUT.format(rank=rank)
    lines = _adapter_lines(records)
    assert len(lines) == WORLD
    assert {(a.body.status, a.body.version) for a in lines} == {
        ("attached_unverified_version", "0.5.24")
    }
    assert "sglang.srt.managers.scheduler:Scheduler.ingest_requests" in lines[0].body.hooks
    assert [m.body.phase for m in of_kind(records, Mark)][-1] == "boot_complete"
    assert _dump_counts(census_document(read_flight(flight)))[("tp:0-1", "all_reduce")] == {
        "0": 6,
        "1": 6,
    }


def _boot_unadapted_with_renamed(tmp_path: Path, version: str, member: str, renamed: str):
    """Boot a copy of the SGLang stand-in, as ``version``, whose scheduler module calls
    ``member`` ``renamed``: the job runs as without the adapter (its output, nothing wrapped).
    The flight's records."""
    tree = tmp_path / "renamed"
    shutil.copytree(STANDINS / "sglang", tree / "sglang")
    scheduler = tree / "sglang" / "srt" / "managers" / "scheduler.py"
    scheduler.write_text(scheduler.read_text().replace(member, renamed))
    site = _site(tmp_path, "sglang", version, tree=tree)
    flight, outs, _ = _boot(tmp_path, "sglang", site)
    for rank in range(WORLD):
        assert _job_output(outs[rank]) == JOB_OUTPUT.format(rank=rank)
        assert _wrapped(outs[rank]) == []
    return read_flight(flight).records


def test_a_next_release_with_a_hook_renamed_is_not_attached_with_one_line(tmp_path):
    """The same next release with one hook point renamed (Scheduler.ingest_requests, a module
    the scheduler process imports last): the run-time check finds it before anything is
    installed; one line names it and the job runs as without the adapter."""
    records = _boot_unadapted_with_renamed(tmp_path, "0.5.24", "ingest_requests", "ingest_reqs")
    lines = _adapter_lines(records)
    assert len(lines) == WORLD  # one a process
    assert {(a.body.status, a.body.failed) for a in lines} == {
        (
            "not_attached",
            AdapterFailure(
                "sglang.srt.managers.scheduler:Scheduler.ingest_requests",
                "sglang.srt.managers.scheduler:Scheduler.ingest_requests: "
                "Scheduler defines no method ingest_requests",
            ),
        )
    }
    assert of_kind(records, Mark) == []


def test_a_missing_hook_point_detaches_everything_with_one_line(tmp_path):
    """A checked version whose Scheduler lacks run_batch (a copy of the stand-in with the
    hook target renamed): the coordinator and runner hooks that attached before it are
    undone, one line names the hook, and the job runs as without the adapter."""
    records = _boot_unadapted_with_renamed(tmp_path, "0.5.22", "run_batch", "run_batch_v2")
    lines = _adapter_lines(records)
    assert len(lines) == WORLD
    assert {(a.body.status, a.body.failed) for a in lines} == {
        (
            "not_attached",
            AdapterFailure(
                "sglang.srt.managers.scheduler:Scheduler.run_batch", "Scheduler has no run_batch"
            ),
        )
    }
    assert of_kind(records, Mark) == []


def test_install_import_hooks_is_idempotent_and_imports_no_framework():
    from rankscope.rank import adapters

    before = list(sys.meta_path)
    try:
        assert adapters.install_import_hooks() is True
        assert adapters.install_import_hooks() is True
        finders = [f for f in sys.meta_path if isinstance(f, adapters.PostImportFinder)]
        assert len(finders) == 1
        assert "sglang.srt.managers.scheduler" in finders[0].watch
        assert "vllm.v1.worker.gpu_worker" in finders[0].watch
        assert not any(m.split(".")[0] in ("sglang", "vllm") for m in sys.modules)
        # An unwatched module imports through its own loader.
        sys.modules.pop("colorsys", None)
        import colorsys

        assert type(colorsys.__loader__).__name__ == "SourceFileLoader"
    finally:
        adapters.uninstall_import_hooks()
    assert sys.meta_path == before


def test_a_process_importing_part_of_a_framework_gets_its_line_at_exit(tmp_path):
    """A front-end process that imports only SGLang's parallel_state: its coordinator is
    counted, and the one adapter line comes at exit with the other modules pending."""
    site = _site(tmp_path, "sglang", "0.5.23")
    flight = tmp_path / "flight"
    code = (
        "from rankscope import adapters; adapters.install_import_hooks(); "
        "import sglang.srt.distributed.parallel_state as ps; "
        "print(hasattr(ps.GroupCoordinator.all_reduce, '__wrapped__'))"
    )
    out = _run_hooked(site, flight, code)
    assert out.stdout.strip() == "True"
    (line,) = _adapter_lines(read_flight(flight).records)
    assert line.body.status == "attached"
    assert line.body.pending == (
        "sglang.srt.model_executor.model_runner",
        "sglang.srt.managers.scheduler",
    )
    assert line.body.hooks
    assert all(h.startswith("sglang.srt.distributed") for h in line.body.hooks)


def test_a_forked_child_of_an_attached_process_gets_its_own_line(tmp_path):
    """vLLM forks its workers by default: the child inherits the hooks and says so in its
    own record file."""
    site = _site(tmp_path, "vllm", "0.34.0")
    flight = tmp_path / "flight"
    code = (
        "import os; from rankscope import adapters; adapters.install_import_hooks(); "
        "import vllm.distributed.parallel_state, vllm.v1.worker.gpu_worker; "
        "pid = os.fork()\n"
        "if pid == 0: os._exit(0)\n"
        "os.waitpid(pid, 0)"
    )
    _run_hooked(site, flight, code)
    lines = _adapter_lines(read_flight(flight).records)
    assert len({line.header.pid for line in lines}) == 2
    assert [line.body.status for line in lines] == ["attached", "attached"]


def test_a_coordinator_without_world_size_is_counted() -> None:
    communicator = types.SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    assert group_of(communicator) is not None
