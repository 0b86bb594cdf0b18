"""The census names a hang while it happens, under `rankscope run` alone (no --compare, no code
change): real torchrun, three real gloo ranks (tests/programs/census_faults.py), the real
`rankscope census` CLI and the real daemon reading the same flight directory.

- a rank skips an all_reduce and all-gathers instead: the job hangs; the CLI, /metrics and
  /api/v1/census name every rank stalled, the collective each is in, and the rank behind;
- a rank SIGKILLed mid-job is named dead, by the CLI (its /proc) and by the daemon;
- a rank that stops in its own code before a collective is named behind, its peers in it;
- a rank skips an all_reduce and the job fails: the JSON says divergent and names it;
- a rank 2.5 s late to an all_reduce, then caught up: the skew is named in the record.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.armed_venv import ArmedVenv, make_armed_venv
from tests.support.services import free_port, stop, wait_http
from tests.support.waiting import wait_for

from rankscope.procfs import read_start_ticks

PROGRAM = Path(__file__).parents[1] / "programs" / "census_faults.py"
WORLD = 3
GROUP = "world:0-2"
NAMED_WITHIN_S = 90.0  # a bound for a loaded machine; the measured figure is in performance.md


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> ArmedVenv:
    return make_armed_venv(tmp_path_factory.mktemp("venv") / "armed")


@contextlib.contextmanager
def job(venv: ArmedVenv, flight: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """The program under `rankscope run -- torchrun`, in a session of its own, killed after."""
    proc = subprocess.Popen(
        venv.run_under_rankscope(
            flight,
            "torchrun",
            "--nproc-per-node",
            str(WORLD),
            "--master-port",
            str(free_port()),
            str(PROGRAM),
            *args,
        ),
        env=venv.env(TORCHELASTIC_ERROR_FILE=""),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        # torchrun starts each rank in a session of its own, and the ranks of a hung job
        # ignore SIGTERM: each process the record names is killed, if it is still that one.
        for path in flight.glob("*.jsonl"):
            *_, pid, ticks = path.stem.split("-")
            if read_start_ticks(int(pid)) == int(ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)


@contextlib.contextmanager
def daemon(venv: ArmedVenv, flight: Path) -> Iterator[str]:
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        venv.rankscope("serve", f"--flight-dir={flight}", f"--web.listen-address={address}"),
        env=venv.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://{address}/metrics", timeout=60, proc=proc)
        yield f"http://{address}"
    finally:
        stop(proc)


def census(venv: ArmedVenv, flight: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        venv.rankscope("census", str(flight), "--json"),
        env=venv.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode == 2:
        return 2, {}
    return done.returncode, json.loads(done.stdout)


def eventually(condition: Callable[[], Any], what: str) -> Any:
    """``condition``'s first true value, polled within the bound a loaded machine names in."""
    return wait_for(condition, timeout=NAMED_WITHIN_S, interval=0.5, what=what)


def census_once_every_rank(
    venv: ArmedVenv, flight: Path, status: int, state: str
) -> dict[str, Any]:
    """The census JSON once the CLI exits ``status`` with every rank of the job in ``state``."""
    _, doc = eventually(
        lambda: (
            (got := census(venv, flight))[0] == status
            and states(got[1]) == dict.fromkeys(range(WORLD), state)
            and got
        ),
        f"every rank named {state}",
    )
    return doc


def states(doc: dict[str, Any]) -> dict[int, str]:
    return {r["rank"]: r["state"] for r in doc.get("ranks", [])}


def latest(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["op"]: e for e in doc["latest"] if e["group"] == GROUP}


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def metric_lines(base: str, name: str) -> list[str]:
    return [line for line in fetch(f"{base}/metrics").splitlines() if line.startswith(name + "{")]


def sample(lines: list[str], value: str, **labels: str) -> bool:
    """A line of ``lines`` carrying every label given, with ``value``."""
    return any(
        all(f'{k}="{v}"' in line for k, v in labels.items()) and line.split()[-1] == value
        for line in lines
    )


def blocked(doc: dict[str, Any], rank: int) -> tuple[str, str, int] | None:
    where = doc["ranks"][rank]["blocked_in"]
    return None if where is None else (where["group"], where["op"], where["seq"])


def test_a_hang_is_named_while_it_hangs_by_the_cli_the_metrics_and_the_api(
    venv: ArmedVenv, tmp_path: Path
) -> None:
    flight = tmp_path / "flight"
    # Rank 2 skips its 6th all_reduce and all-gathers: ranks 0 and 1 wait in all_reduce #6,
    # rank 2 in all_gather #1, until gloo's 300 s timeout; the test ends it first.
    with (
        job(venv, flight, "--fault", "skip-hang", "--rank", "2", "--step", "5", "--steps", "40"),
        daemon(venv, flight) as base,
    ):
        doc = census_once_every_rank(venv, flight, 1, "stalled")
        assert doc["divergent"] is True
        ops = latest(doc)
        assert ops["all_reduce"]["counts"] == {"0": 6, "1": 6, "2": 5}
        assert ops["all_reduce"]["lagging"] == [2]
        assert ops["all_gather"]["lagging"] == [0, 1]
        assert blocked(doc, 0) == blocked(doc, 1) == (GROUP, "all_reduce", 6)
        assert blocked(doc, 2) == (GROUP, "all_gather", 1)
        assert all(r["alive"] is True for r in doc["ranks"])  # the same host: /proc judged
        boot = doc["boot"]

        # The daemon says the same, in /metrics and in /api/v1/census.
        def metrics_agree() -> bool:
            state = metric_lines(base, "rankscope_census_rank_state")
            behind = metric_lines(base, "rankscope_census_latest_deficit")
            inside = metric_lines(base, "rankscope_census_blocked_collective")
            return (
                all(sample(state, "1.0", boot=boot, rank=str(r), state="stalled") for r in range(3))
                and sample(behind, "1.0", rank="2", group=GROUP, op="all_reduce")
                and sample(inside, "6.0", rank="0", group=GROUP, op="all_reduce")
                and sample(inside, "1.0", rank="2", group=GROUP, op="all_gather")
            )

        eventually(metrics_agree, "/metrics names it")
        api = json.loads(fetch(f"{base}/api/v1/census"))
        assert states(api) == dict.fromkeys(range(WORLD), "stalled")
        assert latest(api)["all_reduce"]["lagging"] == [2]
        assert blocked(api, 2) == (GROUP, "all_gather", 1)
        assert api["divergent"] is True


def test_a_rank_killed_mid_job_is_named_dead_by_the_cli_and_the_daemon(
    venv: ArmedVenv, tmp_path: Path
) -> None:
    flight = tmp_path / "flight"
    with job(venv, flight, "--steps", "4000"), daemon(venv, flight) as base:
        doc = census_once_every_rank(venv, flight, 0, "running")
        victim = doc["ranks"][1]["pid"]
        os.kill(victim, signal.SIGKILL)
        status, doc = eventually(
            lambda: (got := census(venv, flight))[1] and states(got[1])[1] == "dead" and got,
            "rank 1 named dead",
        )
        assert status == 1
        assert doc["divergent"] is True
        assert doc["dead_in_group"] == [1]
        assert doc["ranks"][1]["alive"] is False
        eventually(
            lambda: sample(
                metric_lines(base, "rankscope_census_rank_state"), "1.0", rank="1", state="dead"
            ),
            "the daemon names rank 1 dead",
        )
        assert states(json.loads(fetch(f"{base}/api/v1/census")))[1] == "dead"


def test_a_short_job_that_fails_after_a_skip_is_divergent_and_names_the_rank(
    venv: ArmedVenv, tmp_path: Path
) -> None:
    flight = tmp_path / "flight"
    with job(venv, flight, "--fault", "skip-fail", "--rank", "2", "--step", "3") as proc:
        proc.communicate(timeout=300)
        assert proc.returncode != 0
    status, doc = census(venv, flight)
    assert status == 1
    assert doc["divergent"] is True
    assert set(states(doc).values()) == {"exited"}
    entry = latest(doc)["all_reduce"]
    assert entry["lagging"] == [2]
    assert entry["counts"] == {"0": 4, "1": 4, "2": 3}


def test_a_transient_skew_is_named_in_the_record(venv: ArmedVenv, tmp_path: Path) -> None:
    flight = tmp_path / "flight"
    args = ("--fault", "slow", "--rank", "1", "--step", "5", "--slow", "2.5", "--steps", "10")
    with job(venv, flight, *args) as proc:
        proc.communicate(timeout=300)
        assert proc.returncode == 0
    status, doc = census(venv, flight)
    assert status == 0  # made up: every rank exited at the same counts
    assert doc["divergent"] is False
    skews = [s for s in doc["skews"] if s["op"] == "all_reduce"]
    assert len(skews) == 1, doc["skews"]
    (skew,) = skews
    assert skew["lagging"] == [1]
    assert skew["counts"] == {"0": 6, "1": 5, "2": 6}
    assert skew["resolved"] is True
    assert skew["until"] > skew["since"]


def test_a_rank_that_hangs_before_a_collective_is_named_behind(
    venv: ArmedVenv, tmp_path: Path
) -> None:
    flight = tmp_path / "flight"
    # Rank 1 stops in its own code before its 6th all_reduce (a sleep of 600 s stands for a
    # wedged loader or a deadlock); ranks 0 and 2 wait in that all_reduce.
    args = ("--fault", "slow", "--rank", "1", "--step", "5", "--slow", "600", "--steps", "10")
    with job(venv, flight, *args):
        doc = census_once_every_rank(venv, flight, 1, "stalled")
        entry = latest(doc)["all_reduce"]
        assert entry["lagging"] == [1] and entry["counts"] == {"0": 6, "1": 5, "2": 6}
        assert blocked(doc, 0) == blocked(doc, 2) == (GROUP, "all_reduce", 6)
        assert blocked(doc, 1) == (GROUP, "all_reduce", 5)  # the last one it issued
