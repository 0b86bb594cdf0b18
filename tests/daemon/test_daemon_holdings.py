"""Per-pid holdings: /proc parsing on fixture trees, matching host pids to rank records
(NSpid, start ticks, PID namespace), the per-card cap, and attribution across a real PID
namespace made by `unshare --pid --fork --mount-proc` with a real flight record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_cards import CardSide, card_side

from rankscope.daemon.devices import ScriptedSource, write_script
from rankscope.daemon.flightstate import RankProcess
from rankscope.daemon.holdings import attribute, cap, summarize
from rankscope.daemon.registry import TimedCollectors
from rankscope.procfs import ProcCache, ProcInfo, RankIndex, parse_stat_comm, read_proc_info
from rankscope.reports.oom import Holding
from support.pid_namespace import in_pid_namespace
from support.waiting import wait_for

GiB = 1 << 30


def fake_proc(root: Path, pid: int, *, comm: str, start: int, nspid: list[int], pidns: int) -> None:
    """One /proc/PID entry as the kernel lays it out (the fields the holdings read)."""
    d = root / str(pid)
    (d / "ns").mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    fields = ["S", "1", *["0"] * 17, str(start), "0"]  # field 3 .. field 23
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (d / "status").write_text(
        f"Name:\t{comm}\nPid:\t{pid}\nNSpid:\t{' '.join(map(str, nspid))}\nThreads:\t1\n"
    )
    (d / "ns" / "pid").symlink_to(f"pid:[{pidns}]")


def rank(
    pid: int, start: int | None, pidns: int | None, boot: str = "b1", r: int = 0
) -> RankProcess:
    return RankProcess("h", pid, start, pidns, boot, r)


def test_read_proc_info_from_a_fixture_tree(tmp_path: Path) -> None:
    fake_proc(
        tmp_path, 4242, comm="my (odd) proc", start=987654, nspid=[4242, 7, 1], pidns=4026532001
    )
    info = read_proc_info(4242, str(tmp_path))
    assert info == ProcInfo(4242, "my (odd) proc", 987654, (4242, 7, 1), 4026532001)
    assert read_proc_info(1, str(tmp_path)) == ProcInfo(1, None, None, None, None)


def test_match_needs_innermost_pid_start_ticks_and_namespace(tmp_path: Path) -> None:
    fake_proc(tmp_path, 5000, comm="python3", start=100, nspid=[5000, 1], pidns=11)
    fake_proc(tmp_path, 5001, comm="python3", start=100, nspid=[5001, 1], pidns=22)
    fake_proc(tmp_path, 5002, comm="python3", start=101, nspid=[5002, 1], pidns=33)
    fake_proc(tmp_path, 5003, comm="torchrun", start=300, nspid=[5003], pidns=44)
    index = RankIndex(
        [
            rank(1, 100, 11, r=0),  # pid 1 of namespace 11
            rank(1, 100, 22, r=1),  # pid 1 of namespace 22, same start tick
            rank(1, 999, 33, r=2),  # namespace 33, but another start time: a recycled pid
            rank(5003, 300, None, r=3),  # namespace unknown on the record side
            rank(77, None, 44, r=4),  # no start ticks: never matched
        ]
    )
    infos = {pid: read_proc_info(pid, str(tmp_path)) for pid in (5000, 5001, 5002, 5003)}
    matched = {pid: index.match(info) for pid, info in infos.items()}
    assert matched[5000] is not None and matched[5000].rank == 0
    assert matched[5001] is not None and matched[5001].rank == 1
    assert matched[5002] is None
    assert matched[5003] is not None and matched[5003].rank == 3
    # Same innermost pid and start ticks, another namespace: not that rank.
    assert RankIndex([rank(1, 100, 99)]).match(infos[5000]) is None


def test_attribute_names_ranks_and_foreign_by_comm_largest_first(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, comm="python3", start=5, nspid=[10, 2], pidns=8)
    fake_proc(tmp_path, 11, comm="sleep", start=6, nspid=[11], pidns=9)
    held = {10: 3 * GiB, 11: 5 * GiB, 12: None, 13: 1}
    infos = ProcCache(str(tmp_path)).lookup(held)
    got = attribute(held, infos, RankIndex([rank(2, 5, 8, boot="B", r=6)]))
    assert got == [
        Holding(11, "sleep", 5 * GiB, "foreign", None, None),
        Holding(10, "python3", 3 * GiB, "rank", "B", 6),
        Holding(13, "", 1, "foreign", None, None),  # no /proc entry: pid alone
        Holding(12, "", None, "foreign", None, None),  # bytes unknown: last, never 0
    ]
    card = summarize(got, total=20 * GiB, free=10 * GiB)
    assert (card.rank_resident, card.foreign) == (3 * GiB, 5 * GiB + 1)
    assert card.unattributed == 20 * GiB - 10 * GiB - 8 * GiB - 1
    over = summarize(got, total=10 * GiB, free=4 * GiB)
    assert over.unattributed == -(2 * GiB) - 1  # signed, never floored


def test_cap_keeps_the_largest_and_sums_the_rest() -> None:
    holdings = [
        Holding(p, "x", b, "foreign", None, None)
        for p, b in [(1, 50), (2, 40), (3, 30), (4, None), (5, 10)]
    ]
    assert cap(holdings, 5) == holdings
    capped = cap(holdings, 3)
    assert [h.pid for h in capped] == [1, 2, None]
    assert capped[-1] == Holding(None, "", 30 + 10, "overflow", None, None)
    assert len(cap(holdings, 1)) == 1
    with pytest.raises(ValueError):
        cap(holdings, 0)


def test_parse_stat_comm() -> None:
    assert parse_stat_comm("42 (a) b) (c) S 1 2 3") == "a) b) (c"
    assert parse_stat_comm("42 () S 1") == ""
    assert parse_stat_comm("garbage") is None


def test_proc_cache_follows_a_rename_and_rereads_a_recycled_pid(tmp_path: Path) -> None:
    fake_proc(tmp_path, 20, comm="old", start=1, nspid=[20], pidns=1)
    cache = ProcCache(str(tmp_path))
    first = cache.lookup([20])[20]
    assert first.comm == "old" and cache.lookup([20])[20] is first  # unchanged: kept as is
    stat = tmp_path / "20" / "stat"
    stat.write_text(stat.read_text().replace("(old)", "(renamed)"))  # prctl(PR_SET_NAME)
    assert cache.lookup([20])[20] == ProcInfo(20, "renamed", 1, (20,), 1)
    shutil.rmtree(tmp_path / "20")
    fake_proc(tmp_path, 20, comm="new", start=2, nspid=[20, 3], pidns=2)
    assert cache.lookup([20])[20] == ProcInfo(20, "new", 2, (20, 3), 2)


# --- real processes, a real PID namespace ----------------------------------------------

INNER = textwrap.dedent(
    """
    import ctypes, os, sys, time
    from pathlib import Path
    from rankscope.rank.writer import RankIdentity, Recorder
    from rankscope.record import Mark
    ctypes.CDLL(None).prctl(15, b"rank-in-ns", 0, 0, 0)  # PR_SET_NAME: a comm to look for
    rec = Recorder(flight_dir=Path(sys.argv[1]), boot="boot-ns", rank=RankIdentity(rank=3, local_rank=1))
    assert rec.write_record(Mark("boot_complete"))
    print(os.getpid(), flush=True)
    time.sleep(120)
    """
)


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


@pytest.fixture
def namespaced_rank(flight_dir: Path) -> Iterator[tuple[int, int]]:
    """A real process in its own PID namespace that wrote a flight record: (host pid,
    pid it saw)."""
    with in_pid_namespace(INNER, str(flight_dir)) as proc:
        assert proc.stdout is not None
        inner_pid = int(proc.stdout.readline())
        [host_pid] = children(proc.pid)
        yield host_pid, inner_pid


def exposition(monitor: CardSide) -> dict[tuple[str, ...], float]:
    text = generate_latest(TimedCollectors(monitor.collectors).registry()).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "rankscope_gpu_process_bytes":
                labels = s.labels
                key = tuple(labels[k] for k in ("pid", "comm", "role", "boot", "rank"))
                out[key] = s.value
    return out


def test_a_rank_in_another_pid_namespace_is_recognised(
    namespaced_rank: tuple[int, int], flight_dir: Path, tmp_path: Path
) -> None:
    host_pid, inner_pid = namespaced_rank
    assert inner_pid == 1 and host_pid != inner_pid  # the record says pid 1
    [record_file] = flight_dir.glob("marks-*.jsonl")
    record = json.loads(record_file.read_text())
    assert record["pid"] == 1 and record["pidns"] != os.stat("/proc/self/ns/pid").st_ino

    sleeper = subprocess.Popen(["sleep", "120"])
    script = tmp_path / "cards.json"
    try:
        write_script(
            script,
            [{"index": 0, "uuid": "GPU-sim-0", "total": 80 * GiB, "free": 60 * GiB,
              "processes": {str(host_pid): 12 * GiB, str(sleeper.pid): 3 * GiB}}],
        )  # fmt: skip
        monitor = card_side(ScriptedSource(script), flight_dir, holdings_interval=0.1)
        monitor.start()
        try:
            got = wait_for(lambda: exposition(monitor))
            assert got == {
                (str(host_pid), "rank-in-ns", "rank", "boot-ns", "3"): 12 * GiB,
                (str(sleeper.pid), "sleep", "foreign", "", ""): 3 * GiB,
            }
            [c] = monitor.cards_json()["cards"]
            assert (c["rank_resident"], c["foreign"]) == (12 * GiB, 3 * GiB)
            assert c["unattributed"] == 80 * GiB - 60 * GiB - 15 * GiB

            # The sleeper exits and the script stops listing it: its series goes.
            sleeper.kill()
            sleeper.wait()
            write_script(
                script,
                [{"index": 0, "uuid": "GPU-sim-0", "total": 80 * GiB, "free": 60 * GiB,
                  "processes": {str(host_pid): 12 * GiB}}],
            )  # fmt: skip
            gone = wait_for(lambda: (g := exposition(monitor)) and len(g) == 1 and g)
            assert [k[2] for k in gone] == ["rank"]
        finally:
            monitor.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
