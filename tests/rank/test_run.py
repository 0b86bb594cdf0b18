"""`rankscope run` on unmodified programs: real torchrun, torch.distributed.run and
multiprocessing spawn over real gloo, in a venv that holds rankscope-auto.pth the way a pip
install puts it (tests/support/armed_venv.py). The program (tests/programs/collectives.py)
imports nothing from rankscope.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.armed_venv import ArmedVenv, make_armed_venv
from tests.support.services import free_port

from rankscope.record import (
    CensusLive,
    GroupFields,
    Line,
    Mark,
    ProcessStartFields,
    Sample,
    of_kind,
)
from rankscope.record.reader import read_flight

PROGRAM = Path(__file__).parents[1] / "programs" / "collectives.py"
STEPS = 12
EVERY = 6  # a census snapshot every 6 world collectives (3 per step)
GENERIC = ("process_start", "nccl_init_begin", "nccl_init_end", "process_exit")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> ArmedVenv:
    return make_armed_venv(tmp_path_factory.mktemp("venv") / "armed")


def rankscope(venv: ArmedVenv, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        venv.rankscope(*args),
        env=env or venv.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def program_args(*extra: str) -> list[str]:
    return [str(PROGRAM), "--steps", str(STEPS), *extra]


def job_env(venv: ArmedVenv, **extra: str) -> dict[str, str]:
    return venv.env(
        RANKSCOPE_CENSUS_EVERY=str(EVERY),
        TEST_MASTER_PORT=str(free_port()),
        TORCHELASTIC_ERROR_FILE="",
        **extra,
    )


Marks = list[Line[Mark]]


def torchrun_args(flight_dir: Path, ranks: int, *extra: str) -> list[str]:
    """`rankscope run` over torchrun starting ``ranks`` ranks of the program (with ``extra``)."""
    return [
        "run",
        "--dir",
        str(flight_dir),
        "--",
        "torchrun",
        "--nproc-per-node",
        str(ranks),
        *program_args(*extra),
    ]


def run_torchrun(
    venv: ArmedVenv, flight_dir: Path, ranks: int, *extra: str
) -> subprocess.CompletedProcess[str]:
    return rankscope(venv, *torchrun_args(flight_dir, ranks, *extra), env=job_env(venv))


def marks_by_process(flight_dir: Path) -> tuple[Any, dict[Any, Marks]]:
    flight = read_flight(flight_dir)
    by: dict[Any, Marks] = collections.defaultdict(list)
    for line in of_kind(flight.records, Mark):
        by[line.header.process_key].append(line)
    return flight, by


def rank_phases(by: dict[Any, Marks]) -> dict[int, list[str]]:
    """rank -> phases in order, for the processes that joined a process group."""
    out: dict[int, list[str]] = {}
    for marks in by.values():
        ranks = {m.header.rank for m in marks if m.header.rank is not None}
        if ranks:
            (rank,) = ranks
            assert rank not in out, f"two processes recorded rank {rank}"
            out[rank] = [m.body.phase for m in marks]
    return out


def rank_lines(stdout: str) -> list[str]:
    return sorted(re.findall(r"rank \d+: param [\d.]+ last metrics \[[\d, ]*\]", stdout))


def census_doc(venv: ArmedVenv, flight_dir: Path) -> tuple[int, dict[str, Any]]:
    done = rankscope(venv, "census", str(flight_dir), "--json")
    return done.returncode, json.loads(done.stdout)


def assert_every_rank_counted(doc: dict[str, Any], world: int) -> None:
    """Each rank's exit dump holds every collective the program made, STEPS of each."""
    dumped = {d["rank"]: d for d in doc["dumps"]["ranks"]}
    assert sorted(dumped) == list(range(world)), doc["dumps"]
    assert all(d["reason"] == "exit" for d in dumped.values())
    group = f"world:0-{world - 1}"
    by_op = {(e["group"], e["op"]): e for e in doc["dumps"]["entries"]}
    for op in ("all_reduce", "all_gather", "broadcast"):
        entry = by_op[group, op]
        assert entry["counts"] == {str(r): STEPS for r in range(world)}, entry
    # The automatic cadence: snapshots every EVERY world collectives, compared at a common
    # round with every op counted alike.
    assert doc["divergent"] is False
    assert doc["every"] == EVERY
    assert {e["round"] for e in doc["entries"]} == {3 * STEPS}  # every world collective ticks
    assert not any(e["divergent"] for e in doc["entries"])


def test_torchrun_four_ranks_one_boot_generic_marks_and_census(venv: ArmedVenv, tmp_path: Path):
    flight_dir = tmp_path / "flight"
    done = run_torchrun(venv, flight_dir, 4)
    assert done.returncode == 0, done.stderr[-3000:]
    assert rank_lines(done.stdout) == [
        f"rank {r}: param 672.0 last metrics [44, 45, 46, 47]" for r in range(4)
    ]
    flight, by = marks_by_process(flight_dir)
    assert len(flight.boots) == 1, flight.boots
    phases = rank_phases(by)
    assert sorted(phases) == [0, 1, 2, 3]
    for rank, seen in phases.items():
        assert [p for p in seen if p in GENERIC] == list(GENERIC), (rank, seen)
    # The launcher is armed too: a fifth process with no rank, start and exit.
    launchers = [m for m in by.values() if all(x.header.rank is None for x in m)]
    assert [[x.body.phase for x in m] for m in launchers] == [["process_start", "process_exit"]]
    rank2 = next(m for m in by.values() if m[-1].header.rank == 2)
    init_end = next(m.body for m in rank2 if m.body.phase == "nccl_init_end")
    assert isinstance(init_end.extra, dict)
    bad: list[str] = []
    group = GroupFields.parse(init_end.extra, bad)
    assert bad == [] and group.seconds is not None and group.seconds > 0, (bad, group)
    assert (group.group, group.ranks, group.backend) == ("world:0-3", [0, 1, 2, 3], "gloo")
    status, doc = census_doc(venv, flight_dir)
    assert status == 0
    assert_every_rank_counted(doc, 4)


def test_census_names_the_rank_that_skipped_an_all_reduce(venv: ArmedVenv, tmp_path: Path):
    flight_dir = tmp_path / "flight"
    # Rank 3 forgets one all_reduce; its next collective meets its peers' all_reduce and
    # the job hangs there until gloo's timeout (4 s) fails it, as a real job would fail.
    done = run_torchrun(
        venv, flight_dir, 4, "--skip-rank", "3", "--skip-step", "5", "--timeout", "4"
    )
    assert done.returncode == 1, done.stderr[-3000:]  # torchrun's own status for a failed job
    _, doc = census_doc(venv, flight_dir)
    entries = {e["op"]: e for e in doc["dumps"]["entries"]}
    assert entries["all_reduce"]["divergent"]
    assert entries["all_reduce"]["lagging"] == [3]
    assert entries["all_reduce"]["counts"] == {"0": 6, "1": 6, "2": 6, "3": 5}
    text = rankscope(venv, "census", str(flight_dir)).stdout
    assert "world:0-3  all_reduce  0:6 1:6 2:6 3:5  DIVERGENT, lagging: 3" in text


def test_sigterm_ends_ranks_hung_in_a_collective_and_each_dumps(venv: ArmedVenv, tmp_path: Path):
    """The launcher's SIGTERM reaches ranks hung in a mismatched collective (gloo's timeout is
    10 minutes here): each ends at once, as it would without rankscope, and dumps its counts
    first. Had the signal waited for the main thread, torchrun would SIGKILL them after 30 s
    and no rank would dump."""
    flight_dir = tmp_path / "flight"
    args = ["--skip-rank", "1", "--skip-step", "5", "--timeout", "600"]
    job = subprocess.Popen(
        venv.rankscope(*torchrun_args(flight_dir, 2, *args)),
        env=job_env(venv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stalled: dict[int | None, int] = {}  # rank -> pid
    try:
        for _ in range(600):  # the watcher's stall lines: both ranks hang
            if flight_dir.is_dir():
                lines = of_kind(read_flight(flight_dir).records, CensusLive)
                stalled = {x.header.rank: x.header.pid for x in lines if x.body.blocked_in}
            if sorted(stalled) == [0, 1]:
                break
            time.sleep(0.1)
        assert sorted(stalled) == [0, 1]
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=25)  # well inside torchrun's 30 s before its SIGKILL
    finally:
        if job.poll() is None:  # torchrun starts each rank in a session of its own
            for pid in stalled.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            job.kill()
            job.communicate()
    _, doc = census_doc(venv, flight_dir)
    assert [(d["rank"], d["reason"]) for d in doc["dumps"]["ranks"]] == [
        (0, "SIGTERM"),
        (1, "SIGTERM"),
    ]
    entries = {e["op"]: e for e in doc["dumps"]["entries"]}
    assert entries["all_reduce"]["counts"] == {"0": 6, "1": 5}
    assert entries["all_reduce"]["lagging"] == [1]


def test_torch_distributed_run_output_and_status_unchanged(venv: ArmedVenv, tmp_path: Path):
    flight_dir = tmp_path / "flight"
    launcher = [venv.python, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    plain = subprocess.run(
        [*launcher, *program_args()],
        env=job_env(venv),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    armed = rankscope(
        venv, "run", "--dir", str(flight_dir), "--", *launcher, *program_args(), env=job_env(venv)
    )
    assert armed.returncode == plain.returncode
    # Two ranks share one stdout, so their lines may interleave differently from run to run
    # (a line's text and its newline can land apart): compare what each rank printed.
    assert rank_lines(armed.stdout) == rank_lines(plain.stdout)
    assert len(rank_lines(plain.stdout)) == 2
    # rankscope adds nothing to stderr. A line the program prints anyway (a torch warning
    # naming the venv's path, which holds the clone's folder "rankscope") is the program's.
    added = collections.Counter(armed.stderr.splitlines()) - collections.Counter(
        plain.stderr.splitlines()
    )
    assert [line for line in added if "rankscope" in line] == [], armed.stderr[-3000:]
    assert "Failed to initialize NumPy" not in plain.stderr  # numpy sits beside torch
    flight, by = marks_by_process(flight_dir)
    assert len(flight.boots) == 1
    assert sorted(rank_phases(by)) == [0, 1]
    assert not list(Path(tmp_path).glob("flight-unarmed*"))
    _, doc = census_doc(venv, flight_dir)
    assert_every_rank_counted(doc, 2)


def test_multiprocessing_spawn_children_are_armed(venv: ArmedVenv, tmp_path: Path):
    flight_dir = tmp_path / "flight"
    # --compare: rankscope's own gloo group and thread; the program still exits 0, and the
    # group's creation is no mark of the program's.
    done = rankscope(
        venv,
        "run",
        "--compare",
        "--dir",
        str(flight_dir),
        "--",
        venv.python,
        *program_args("--spawn", "2"),
        env=job_env(venv),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    flight, by = marks_by_process(flight_dir)
    assert len(flight.boots) == 1
    phases = rank_phases(by)  # no RANK in a spawned child's environment: taken from torch
    assert sorted(phases) == [0, 1]
    for seen in phases.values():
        assert seen == list(GENERIC)
    _, doc = census_doc(venv, flight_dir)
    assert_every_rank_counted(doc, 2)


def test_rankscope_auto_without_the_wrapper(venv: ArmedVenv, tmp_path: Path):
    """A launcher that cannot be wrapped (a pod spec, Slurm): two variables, same record."""
    flight_dir = tmp_path / "flight"
    env = job_env(venv, RANKSCOPE_AUTO="1", RANKSCOPE_DIR=str(flight_dir))
    done = subprocess.run(
        ["torchrun", "--nproc-per-node", "2", *program_args()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    flight, by = marks_by_process(flight_dir)
    assert len(flight.boots) == 1, flight.boots  # the launcher published its boot id
    assert len(by) == 3  # torchrun and its two workers
    assert sorted(rank_phases(by)) == [0, 1]
    _, doc = census_doc(venv, flight_dir)
    assert_every_rank_counted(doc, 2)


def test_unarmed_python_imports_nothing_of_rankscope(venv: ArmedVenv):
    probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('rankscope')))"
    unarmed = subprocess.run(
        [venv.python, "-c", probe], env=venv.env(), capture_output=True, text=True, timeout=60
    )
    assert unarmed.stdout.strip() == "[]"
    armed_dir = venv.root.parent / "armed-flight"
    armed = subprocess.run(
        [venv.python, "-c", probe + "; print('torch' in sys.modules)"],
        env=venv.env(RANKSCOPE_AUTO="1", RANKSCOPE_DIR=str(armed_dir)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "'rankscope.rank.auto'" in armed.stdout  # the same venv does arm when asked
    assert armed.stdout.splitlines()[-1] == "False"  # and never imports torch itself
    assert armed.stderr == ""


# --- bad input and pass-through ---------------------------------------------------------


def test_bad_input_is_refused_with_a_clear_line(venv: ArmedVenv, tmp_path: Path):
    flight = str(tmp_path / "flight")
    none = rankscope(venv, "run", "--dir", flight)
    assert none.returncode == 2 and "rankscope run: no command given" in none.stderr
    missing = rankscope(venv, "run", "--dir", flight, "--", "no-such-command-xyz", "a")
    assert missing.returncode == 127
    assert missing.stderr.strip() == "rankscope run: no-such-command-xyz: command not found"
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    unwritable = rankscope(venv, "run", "--dir", str(a_file / "sub"), "--", "true")
    assert unwritable.returncode == 2
    assert unwritable.stderr.startswith(
        f"rankscope run: cannot write the flight directory {a_file}"
    )
    no_dir = rankscope(venv, "run", "--", "true")
    assert no_dir.returncode == 2 and "give --dir DIR or set RANKSCOPE_DIR" in no_dir.stderr


def test_status_output_and_signals_are_the_commands(venv: ArmedVenv, tmp_path: Path):
    flight = str(tmp_path / "flight")
    program = "import sys; sys.stdout.write('out\\n'); sys.stderr.write('err\\n'); sys.exit(5)"
    plain = subprocess.run(
        [venv.python, "-c", program], env=venv.env(), capture_output=True, timeout=60
    )
    armed = rankscope(venv, "run", "--dir", flight, "--", venv.python, "-c", program)
    assert (armed.returncode, armed.stdout, armed.stderr) == (5, "out\n", "err\n")
    assert plain.returncode == 5
    killed = rankscope(venv, "run", "--dir", flight, "--", "sh", "-c", "kill -KILL $$")
    assert killed.returncode == -9  # died of the signal itself, as without rankscope
    # SIGTERM to the pid we started reaches the program: it handles it and exits 7.
    handler = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(7)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [venv.python, "-m", "rankscope", "run", "--dir", flight, "--", venv.python, "-c", handler],
        env=venv.env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.terminate()
    assert proc.wait(timeout=30) == 7
    assert proc.stdout.read() == "got SIGTERM\n"
    # SIGPIPE is the command's default again (Python ignores it for itself).
    pipe = subprocess.run(
        f"{venv.python} -m rankscope run --dir {flight} -- yes | head -n 1; "
        'echo "${PIPESTATUS[0]}"',
        shell=True,
        executable="/bin/bash",
        env=venv.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pipe.stdout.split() == ["y", str(128 + 13)]
    # Both armed Python programs recorded their start and their (normal) exit.
    phases = [m.body.phase for m in of_kind(read_flight(flight, all_boots=True).records, Mark)]
    assert sorted(phases) == ["process_exit"] * 2 + ["process_start"] * 2


def test_user_marks_and_generic_marks_share_one_ledger_and_samples_run(
    venv: ArmedVenv, tmp_path: Path
):
    flight = tmp_path / "flight"
    program = (
        "import time\n"
        "from rankscope import probe\n"
        "class KV:\n"
        "    reserved_bytes = 1 << 20\n"
        "    def __init__(self): self.backed_bytes = 0\n"
        "    retained_bytes = 0\n"
        "kv = KV()\n"
        "probe.arenas.register('kv', kv)\n"
        "probe.mark('kv_pool_sized')\n"
        "import torch\n"  # the torch hook starts the sampler
        "for i in range(1, 9):\n"
        "    kv.backed_bytes = i * 4096\n"
        "    time.sleep(0.1)\n"
    )
    done = rankscope(
        venv,
        "run",
        "--dir",
        str(flight),
        "--",
        venv.python,
        "-c",
        program,
        env=venv.env(RANKSCOPE_SAMPLE_EVERY="0.15"),
    )
    assert done.returncode == 0, done.stderr
    records = read_flight(flight).records
    phases = [m.body.phase for m in of_kind(records, Mark)]
    assert phases == ["process_start", "kv_pool_sized", "process_exit"]
    samples = [line.body for line in of_kind(records, Sample)]
    backed = [s.arenas["kv"].backed for s in samples]
    assert len(backed) >= 3, backed
    assert backed == sorted(backed) and backed[-1] > backed[0]  # a time series, not a value
    assert all(s.torch.why == "CUDA not initialised in this process" for s in samples)


def test_forkserver_children_record_as_themselves(venv: ArmedVenv, tmp_path: Path):
    flight = tmp_path / "flight"
    program = (
        "import multiprocessing as mp\n"
        "def work(q):\n"
        "    q.put(sum(range(10)))\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('forkserver')\n"
        "    q = ctx.Queue()\n"
        "    p = ctx.Process(target=work, args=(q,))\n"
        "    p.start(); print(q.get()); p.join()\n"
        "    raise SystemExit(p.exitcode)\n"
    )
    script = tmp_path / "fs.py"
    script.write_text(program)
    done = rankscope(venv, "run", "--dir", str(flight), "--", venv.python, str(script))
    assert (done.returncode, done.stdout) == (0, "45\n"), done.stderr
    _, by = marks_by_process(flight)
    starts = [m[0].body for m in by.values()]
    assert all(s.phase == "process_start" for s in starts)
    # Fresh interpreters: the program, the forkserver, multiprocessing's resource tracker;
    # and the worker the forkserver forked.
    fields = [ProcessStartFields.parse(s.extra, []) for s in starts if isinstance(s.extra, dict)]
    assert sorted(f.forked for f in fields) == [False, False, False, True]
    assert all(f.python for f in fields if not f.forked), fields
    assert len({m[0].header.boot for m in by.values()}) == 1
