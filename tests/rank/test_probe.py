"""The probe in real processes: what a mark records, identity and boot ids, PID namespaces,
and the disks that refuse it. torch is the real CPU build; no GPU here, so the CUDA fields
must be null with their reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope.procfs import HOST_PIDNS_INODE, read_nspid, read_pidns_inode, read_start_ticks
from rankscope.rank import probe
from rankscope.rank.probe.torch_view import NOT_IMPORTED, NOT_INITIALISED
from rankscope.rank.writer import Recorder, publish_boot_id, resolve_boot_id
from rankscope.record import (
    Line,
    Mark,
    MarkDerived,
    MarkDevice,
    MarkDriver,
    MarkNvml,
    MarkTorch,
    of_kind,
)
from rankscope.record.reader import read_flight


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANKSCOPE_", "TORCHELASTIC"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env.update(extra)
    return env


def run_py(
    code: str, env: dict[str, str], prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def records(flight: Path) -> list[Line[Mark]]:
    return of_kind(read_flight(flight, all_boots=True).records, Mark)


# --- arming ---------------------------------------------------------------------------------


def test_a_disarmed_mark_writes_nothing_and_imports_nothing(tmp_path: Path) -> None:
    code = """
        import sys
        from rankscope.rank import probe
        assert probe.mark("pre_weight_load", x=1) is None
        print(sorted(m for m in ("torch", "pynvml") if m in sys.modules))
    """
    proc = run_py(code, clean_env(), ())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert proc.stderr == ""


def test_a_mark_without_torch_records_nulls_with_the_reason(flight_dir: Path) -> None:
    code = """
        import sys
        from rankscope.rank import probe
        probe.mark("pre_weight_load", shards=4)
        assert "torch" not in sys.modules and "pynvml" not in sys.modules, "the mark imported"
    """
    proc = run_py(
        code, clean_env(RANKSCOPE_DIR=str(flight_dir), RANK="3", LOCAL_RANK="1", WORLD_SIZE="8")
    )
    assert proc.returncode == 0, proc.stderr
    (rec,) = records(flight_dir)
    assert rec.header.v == 1 and rec.header.kind == "mark" and rec.body.phase == "pre_weight_load"
    assert rec.body.extra == {"shards": 4}
    assert (rec.header.rank, rec.header.local_rank, rec.header.world_size) == (3, 1, 8)
    body = rec.body
    assert body.torch == MarkTorch(why=NOT_IMPORTED)
    assert body.driver == MarkDriver(why=NOT_IMPORTED)
    assert body.nvml == MarkNvml(why=NOT_IMPORTED)
    assert body.derived == MarkDerived(None, False, None)
    assert body.device == MarkDevice(why=NOT_IMPORTED)


def test_a_mark_with_torch_but_no_cuda_leaves_cuda_uninitialised(flight_dir: Path) -> None:
    code = """
        import torch
        from rankscope.rank import probe
        probe.mark("pre_weight_load")
        weights = torch.zeros(1 << 20)  # CPU tensors: the CUDA allocator stays untouched
        probe.mark("weights_loaded")
        assert not torch.cuda.is_initialized(), "a mark initialised CUDA"
    """
    proc = run_py(code, clean_env(RANKSCOPE_DIR=str(flight_dir)))
    assert proc.returncode == 0, proc.stderr
    recs = records(flight_dir)
    assert [r.body.phase for r in recs] == ["pre_weight_load", "weights_loaded"]
    for rec in recs:
        assert rec.body.torch.reserved is None
        assert rec.body.torch.why == NOT_INITIALISED
        assert rec.body.nvml.self_bytes is None


def test_process_identity_is_pid_and_start_ticks(flight_dir: Path) -> None:
    code = """
        import os, time
        from rankscope.rank import probe
        probe.mark("a")
        print(os.getpid(), flush=True)
    """
    proc = run_py(code, clean_env(RANKSCOPE_DIR=str(flight_dir)))
    assert proc.returncode == 0, proc.stderr
    (rec,) = records(flight_dir)
    assert rec.header.pid == int(proc.stdout)
    assert isinstance(rec.header.start_ticks, int) and rec.header.start_ticks > 0
    assert rec.header.pidns == read_pidns_inode() == HOST_PIDNS_INODE
    assert rec.header.nspid == (rec.header.pid,)
    assert (
        rec.header.file
        == f"marks-{rec.header.host}-{rec.header.pid}-{rec.header.start_ticks}.jsonl"
    )
    assert isinstance(rec.header.mono, float) and abs(rec.header.wall - time.time()) < 60


def test_configure_and_the_per_mark_runner(flight_dir: Path) -> None:
    code = f"""
        from rankscope.rank import probe
        probe.configure(flight_dir={str(flight_dir)!r}, tp_rank=1, pp_rank=2, runner="target")
        probe.mark("capture_end")
        probe.mark("capture_end", runner="draft")
        probe.mark("boot_complete", note="ok")
    """
    proc = run_py(code, clean_env())  # no RANKSCOPE_DIR: configure arms the probe
    assert proc.returncode == 0, proc.stderr
    recs = records(flight_dir)
    assert [(r.body.phase, r.header.runner) for r in recs] == [
        ("capture_end", "target"),
        ("capture_end", "draft"),
        ("boot_complete", "target"),
    ]
    assert {(r.header.tp_rank, r.header.pp_rank) for r in recs} == {(1, 2)}
    assert recs[2].body.extra == {"note": "ok"}


# --- boot ids -------------------------------------------------------------------------------


def test_boot_id_precedence() -> None:
    assert resolve_boot_id({"RANKSCOPE_BOOT_ID": "mine", "TORCHELASTIC_RUN_ID": "te"}) == "mine"
    assert resolve_boot_id({"TORCHELASTIC_RUN_ID": "te"}) == "te"
    boot = resolve_boot_id({"TORCHELASTIC_RUN_ID": "none"})
    host = os.uname().nodename
    assert boot == f"{host}-{os.getppid()}-{read_start_ticks(os.getppid())}"
    env: dict[str, str] = {}
    published = publish_boot_id(env)
    assert env["RANKSCOPE_BOOT_ID"] == published == f"{host}-{os.getpid()}-{read_start_ticks()}"
    assert publish_boot_id({"TORCHELASTIC_RUN_ID": "te"}) == "te"


LAUNCHER = """
    import os, subprocess, sys
    from rankscope.rank import probe
    if os.environ.get("PUBLISH"):
        print(probe.publish_boot_id(), flush=True)
    child = "from rankscope import probe; probe.mark('pre_weight_load')"
    # Through an intermediate shell when asked: the ranks are then grandchildren.
    wrap = ["sh", "-c", '"$0" "$@"'] if os.environ.get("GRANDCHILDREN") else []
    procs = [subprocess.Popen([*wrap, sys.executable, "-c", child], env=dict(os.environ, RANK=str(r)))
             for r in range(3)]
    assert all(p.wait() == 0 for p in procs)
"""


def test_ranks_of_one_launch_agree_on_the_boot_and_two_launches_are_two_boots(
    flight_dir: Path,
) -> None:
    for _ in range(2):
        proc = run_py(LAUNCHER, clean_env(RANKSCOPE_DIR=str(flight_dir)))
        assert proc.returncode == 0, proc.stderr
        time.sleep(0.01)  # distinct first-record times
    flight = read_flight(flight_dir)
    assert len(flight.boots) == 2
    assert all(b.processes == 3 and b.ranks == [0, 1, 2] for b in flight.boots)
    assert flight.boot == flight.boots[-1].boot
    assert len(flight.records) == 3


def test_a_published_boot_id_reaches_grandchildren(flight_dir: Path) -> None:
    env = clean_env(RANKSCOPE_DIR=str(flight_dir), GRANDCHILDREN="1")
    unpublished = run_py(LAUNCHER, env)
    assert unpublished.returncode == 0, unpublished.stderr
    # Without publishing, each rank derives its id from its own parent shell: three boots.
    assert len(read_flight(flight_dir).boots) == 3

    for f in flight_dir.iterdir():
        f.unlink()
    published = run_py(LAUNCHER, dict(env, PUBLISH="1"))
    assert published.returncode == 0, published.stderr
    flight = read_flight(flight_dir)
    assert [b.boot for b in flight.boots] == [published.stdout.strip()]
    assert flight.boots[0].processes == 3


# --- PID namespaces -------------------------------------------------------------------------


def find_host_pid(rec: dict[str, Any]) -> list[int]:
    """The daemon's matching rule (docs/architecture.md): NSpid's last entry, start ticks and
    the namespace inode."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        nspid = read_nspid(entry)
        if (
            nspid
            and nspid[-1] == rec.header.pid
            and read_start_ticks(entry) == rec.header.start_ticks
            and read_pidns_inode(entry) == rec.header.pidns
        ):
            found.append(int(entry))
    return found


def test_a_rank_in_its_own_pid_namespace_can_be_matched_from_the_host(flight_dir: Path) -> None:
    code = """
        import sys
        from rankscope.rank import probe
        probe.mark("pre_weight_load")
        print("marked", flush=True)
        sys.stdin.readline()
    """
    child = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env(RANKSCOPE_DIR=str(flight_dir)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "marked"
        (rec,) = records(flight_dir)
        assert rec.header.pid == 1  # the first process of the new namespace
        assert rec.header.pidns != HOST_PIDNS_INODE
        matches = find_host_pid(rec)
        assert len(matches) == 1 and matches[0] != 1
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# --- disks that refuse the record -----------------------------------------------------------

UNRELIABLE_DISK = """
    import logging, sys, time
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    from rankscope.rank import probe
    from rankscope.rank.writer import RECORDER
    start = time.monotonic()
    results = [probe.mark("m", seq=i, pad="x" * 4000) for i in range(50)]
    assert all(r is not None and r.phase == "m" for r in results), "a mark failed"
    print(RECORDER.lines_written, RECORDER.lines_dropped, round(time.monotonic() - start, 3))
"""


def in_private_mount(
    mount_args: str, target: Path, code: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a mount namespace of its own, with a tmpfs mounted on ``target``: root
    ignores permission bits, not a read-only or full filesystem."""
    script = f'mount -t tmpfs -o {mount_args} tmpfs "$1" && shift && exec "$@"'
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "sh",
            "-c",
            script,
            "sh",
            str(target),
            sys.executable,
            "-c",
            textwrap.dedent(code),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("rankscope:")]


def test_a_read_only_flight_directory_costs_one_warning(flight_dir: Path) -> None:
    proc = in_private_mount(
        "ro,size=1m", flight_dir, UNRELIABLE_DISK, clean_env(RANKSCOPE_DIR=str(flight_dir / "run"))
    )
    assert proc.returncode == 0, proc.stderr
    written, dropped, _ = proc.stdout.split()
    assert (written, dropped) == ("0", "50")
    (warning,) = warnings_in(proc.stderr)
    assert "Read-only file system" in warning


def test_a_full_disk_costs_one_warning_and_keeps_what_fit(flight_dir: Path) -> None:
    code = (
        UNRELIABLE_DISK
        + f"""
    import shutil
    shutil.copytree({str(flight_dir / "run")!r}, {str(flight_dir / "copy")!r})
    """
    )
    # Runs inside the namespace, so copy what fit to the test's view before the tmpfs goes.
    (flight_dir / "run").mkdir()
    proc = in_private_mount(
        "size=64k", flight_dir / "run", code, clean_env(RANKSCOPE_DIR=str(flight_dir / "run"))
    )
    assert proc.returncode == 0, proc.stderr
    written, dropped, _ = map(float, proc.stdout.split())
    assert written > 0 and dropped > 0 and written + dropped == 50
    (warning,) = warnings_in(proc.stderr)
    assert "full" in warning or "No space left" in warning
    flight = read_flight(flight_dir / "copy")
    seqs = [r.body.extra["seq"] for r in flight.records]
    assert seqs == list(range(int(written)))
    assert flight.skipped["malformed"] == 0


def test_a_flight_directory_under_a_regular_file_costs_one_warning(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_py(UNRELIABLE_DISK, clean_env(RANKSCOPE_DIR=str(blocker / "flight")))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["0", "50"]
    assert len(warnings_in(proc.stderr)) == 1


# --- a mark never raises --------------------------------------------------------------------


@pytest.fixture
def recorder(flight_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder(flight_dir=flight_dir, boot="test-boot")
    monkeypatch.setattr(probe, "RECORDER", rec)
    monkeypatch.setattr(probe, "ARMED", True)  # the mark follows the process's RECORDER
    return rec


def test_an_unserialisable_extra_is_recorded_as_text(recorder: Recorder, flight_dir: Path) -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque-thing"

    assert probe.mark("weights_loaded", obj=Opaque(), path=flight_dir, ids={3}) is not None
    (rec,) = records(flight_dir)
    assert rec.body.extra == {"obj": "opaque-thing", "path": str(flight_dir), "ids": [3]}


def test_a_cyclic_extra_costs_its_line_never_an_exception(
    recorder: Recorder, flight_dir: Path
) -> None:
    loop: list[object] = []
    loop.append(loop)
    assert probe.mark("a", loop=loop) is not None
    assert recorder.lines_dropped == 1
    assert probe.mark("b", ok=[1]) is not None  # the encoder is still usable
    assert [r.body.phase for r in records(flight_dir)] == ["b"]


def test_a_failing_view_costs_one_warning_never_an_exception(
    recorder: Recorder,
    flight_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(index: int | None = None) -> None:
        raise RuntimeError("driver went away")

    monkeypatch.setattr(probe.TORCH, "read", broken)
    monkeypatch.setattr(probe, "_failures_warned", set())
    assert probe.mark("a") is None
    assert probe.mark("b") is None
    assert [r.message for r in caplog.records].count(
        "rankscope: mark('a') failed and was skipped: RuntimeError('driver went away'); "
        "further failures are not logged"
    ) == 1
    assert len(caplog.records) == 1
    assert records(flight_dir) == []


def test_a_forked_child_records_as_itself(flight_dir: Path) -> None:
    code = """
        import os
        from rankscope.rank import probe
        probe.mark("parent")
        pid = os.fork()
        if pid == 0:
            probe.mark("child")
            os._exit(0)
        os.waitpid(pid, 0)
        print(pid)
    """
    proc = run_py(code, clean_env(RANKSCOPE_DIR=str(flight_dir)))
    assert proc.returncode == 0, proc.stderr
    recs = records(flight_dir)
    by_phase = {r.body.phase: r for r in recs}
    assert by_phase["child"].header.pid == int(proc.stdout)
    assert by_phase["child"].header.file != by_phase["parent"].header.file
    assert by_phase["child"].header.boot == by_phase["parent"].header.boot
    assert by_phase["child"].header.nspid == (int(proc.stdout),)


# --- the line encoder -----------------------------------------------------------------------


def test_each_line_is_its_header_then_its_body(recorder: Recorder, flight_dir: Path) -> None:
    recorder.write_record(Mark("a"))
    recorder.write_record(Mark("b"), runner="draft")
    recorder.write_record(Mark("c"))  # the configured runner again, not the last line's
    probe.configure(tp_rank=3, runner="target")  # the cached header must follow
    recorder.write_record(Mark("d"))
    raw = next(flight_dir.iterdir()).read_text().splitlines()
    lines = [json.loads(line) for line in raw]
    for line in lines:
        assert line["v"] == 1 and line["boot"] == "test-boot" and line["pid"] == os.getpid()
        assert isinstance(line["mono"], float)
    assert [(x["kind"], x["phase"], x["runner"], x["tp_rank"]) for x in lines] == [
        ("mark", "a", None, None),
        ("mark", "b", "draft", None),
        ("mark", "c", None, None),
        ("mark", "d", "target", 3),
    ]
    # Field order as header(): the body follows the header, nothing is duplicated.
    assert list(lines[0]) == [*recorder.header("mark"), *Mark("a").to_json()]
    assert all(line.count('"runner"') == 1 for line in raw)


def test_a_flight_directory_the_os_rejects_outright_costs_one_warning(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    probe.configure(flight_dir="bad\0dir")  # ValueError from the OS layer, not an OSError
    assert probe.mark("a") is not None and probe.mark("b") is not None
    assert recorder.lines_dropped == 2
    (warning,) = [r.message for r in caplog.records]
    assert "embedded null byte" in warning


def test_extras_may_use_any_name(recorder: Recorder, flight_dir: Path) -> None:
    assert probe.mark("kv_pool_sized", phase="shadowed", extra=1, kind="x") is not None
    (rec,) = records(flight_dir)
    assert rec.body.phase == "kv_pool_sized" and rec.header.kind == "mark"
    assert rec.body.extra == {"phase": "shadowed", "extra": 1, "kind": "x"}
