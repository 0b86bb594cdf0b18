"""The census in one process: counting, group names, comparison, CUDA-graph accounting, the
coordinator-method wrapper, snapshots and local dumps (real files, real signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from rankscope.rank import census
from rankscope.rank.census import counts, graphs, snapshots
from rankscope.rank.census.wrap import patch, undo_all
from rankscope.rank.writer import RankIdentity, Recorder
from rankscope.record import GraphCounts
from rankscope.record.compare import compare_group, compare_ranks


@pytest.fixture(autouse=True)
def fresh_census(monkeypatch: pytest.MonkeyPatch) -> Any:
    # Signal handlers are tested in child processes, never installed in pytest's own.
    monkeypatch.setattr(snapshots.STATE, "handlers_installed", True)
    counts.reset()
    graphs.reset()
    snapshots.reset()
    yield
    counts.reset()
    graphs.reset()
    snapshots.reset()


@pytest.fixture
def recorder(flight_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder(flight_dir=flight_dir, boot="b1", rank=RankIdentity(rank=0, world_size=2))
    monkeypatch.setattr(snapshots, "RECORDER", rec)
    return rec


def lines(flight_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(flight_dir.glob("census-*.jsonl")):
        out += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return out


# --- counting and names ---------------------------------------------------------------------


def test_count_keys_by_group_instance_and_op() -> None:
    census.count("tp:0-3", "all_reduce")
    census.count("tp:0-3", "all_reduce", 3)
    census.count("tp:4-7", "all_reduce")
    assert census.snapshot() == {("tp:0-3", "all_reduce"): 4, ("tp:4-7", "all_reduce"): 1}


def test_count_never_raises_and_counts_the_failure() -> None:
    before = counts.failures
    census.count(["unhashable"], "all_reduce")  # type: ignore[arg-type]
    census.count("tp:0-1", "all_reduce", "x")  # type: ignore[arg-type]
    assert counts.failures == before + 2
    assert not any(census.snapshot().values())


def test_disarmed_by_environment_counts_nothing() -> None:
    code = textwrap.dedent(
        """
        from rankscope.rank import census
        census.count("tp:0-1", "all_reduce")
        census.tick()
        print(census.ARMED, dict(census.snapshot()), census.current_round())
        """
    )
    env = dict(os.environ, RANKSCOPE_CENSUS="0")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "{}", "0"]


@pytest.mark.parametrize(
    ("ranks", "name"),
    [([0, 1, 2, 3], "tp:0-3"), ([4, 0], "pp:0,4"), ([5, 0, 1, 2], "tp:0-2,5"), ([7], "tp:7")],
)
def test_group_instance_names_round_trip(ranks: list[int], name: str) -> None:
    base = name.split(":")[0]
    assert census.group_instance(base, ranks) == name
    assert census.parse_instance(name) == (base, tuple(sorted(ranks)))


@pytest.mark.parametrize("bad", ["tp", "tp:", "tp:a-b", "tp:3-1", "tp:?"])
def test_parse_instance_rejects_names_without_ranks(bad: str) -> None:
    assert census.parse_instance(bad) is None


def test_p2p_names_carry_the_peer_and_are_cached() -> None:
    assert census.p2p_name("send", 3) == "send>3"
    assert census.p2p_name("recv", 0) == "recv<0"
    assert census.p2p_name("send", 3) is census.p2p_name("send", 3)


# --- comparison -------------------------------------------------------------------------------


def test_missing_key_counts_as_zero_and_names_the_laggard() -> None:
    entries = compare_group("tp:0-2", {0: {"all_reduce": 5}, 1: {"all_reduce": 5}, 2: {}})
    assert entries == [
        {
            "group": "tp:0-2",
            "op": "all_reduce",
            "counts": {"0": 5, "1": 5, "2": 0},
            "divergent": True,
            "lagging": [2],
        }
    ]


def test_p2p_pairs_sends_with_the_peer_recvs() -> None:
    ok = compare_group("pp:0-1", {0: {"send>1": 4}, 1: {"recv<0": 4}})
    assert [(e["op"], e["divergent"]) for e in ok] == [("p2p 0>1", False)]
    short = compare_group("pp:0-1", {0: {"send>1": 4}, 1: {"recv<0": 3}})
    assert short[0]["counts"] == {"0": 4, "1": 3} and short[0]["lagging"] == [1]


def test_only_members_of_an_instance_are_compared() -> None:
    per_rank = {
        0: {("tp:0-1", "all_reduce"): 9},
        1: {("tp:0-1", "all_reduce"): 9},
        2: {("tp:2-3", "all_reduce"): 4},
        3: {("tp:2-3", "all_reduce"): 3},
    }
    entries = compare_ranks(per_rank)
    assert [(e["group"], e["divergent"], e["lagging"]) for e in entries] == [
        ("tp:0-1", False, []),
        ("tp:2-3", True, [3]),
    ]


# --- CUDA graphs (explicit API; the torch.cuda.CUDAGraph hooks run in the gpu test) ----------


def test_captured_collectives_are_added_on_every_replay() -> None:
    census.count("tp:0-1", "all_reduce")  # a warm-up run, outside the capture
    with census.capture("decode-bs8"):
        census.count("tp:0-1", "all_reduce")
        census.count("tp:0-1", "all_gather", 2)
    for _ in range(5):
        census.replay("decode-bs8")
    census.replay("decode-bs8", n=2)
    assert census.snapshot() == {("tp:0-1", "all_reduce"): 2 + 7, ("tp:0-1", "all_gather"): 2 + 14}
    payload = graphs.graph_counts()
    assert payload == {
        "graph1": GraphCounts({("tp:0-1", "all_gather"): 2, ("tp:0-1", "all_reduce"): 1}, 7)
    }


def test_failed_capture_and_unknown_replay_are_not_counted() -> None:
    with pytest.raises(RuntimeError), census.capture("g"):
        census.count("tp:0-1", "all_reduce")
        raise RuntimeError("capture failed")
    census.replay("g")
    census.replay("never-captured")
    assert census.snapshot() == {("tp:0-1", "all_reduce"): 1}
    assert graphs.unknown_replays == 2


def test_graph_objects_are_held_weakly() -> None:
    class Graph:
        pass

    g = Graph()
    with census.capture(g, name="bs1"):
        census.count("tp:0-1", "all_reduce")
    census.replay(g)
    assert "bs1" in graphs.graph_counts()
    del g
    assert graphs.graph_counts() == {}


class GraphShaped:
    """STAND-IN for torch.cuda.CUDAGraph (no GPU here), its methods shaped as torch 2.11's: the
    torch.cuda.graph context manager calls ``capture_begin(*pool, capture_error_mode=mode)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self.calls.append(("begin", pool, capture_error_mode))

    def capture_end(self) -> None:
        self.calls.append(("end",))

    def replay(self) -> None:
        self.calls.append(("replay",))


def test_the_graph_hooks_hand_torch_its_arguments_and_count_each_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", GraphShaped)
    undo = census.instrument_cuda_graphs()
    try:
        g = GraphShaped()
        g.capture_begin((0, 7), capture_error_mode="thread_local")  # a shared pool, as inductor
        census.count("tp:0-1", "all_reduce")
        g.capture_end()
        for _ in range(3):
            g.replay()
    finally:
        undo()
    assert g.calls == [("begin", (0, 7), "thread_local"), ("end",), *[("replay",)] * 3]
    assert census.snapshot() == {("tp:0-1", "all_reduce"): 1 + 3}
    assert list(graphs.graph_counts().values()) == [GraphCounts({("tp:0-1", "all_reduce"): 1}, 3)]


# --- the coordinator-method wrapper ------------------------------------------------------------


class Coordinator:
    """Shaped like SGLang's and vLLM's GroupCoordinator (unique_name, ranks, rank_in_group)."""

    def __init__(self, name: str, ranks: list[int], rank: int) -> None:
        self.unique_name = name
        self.ranks = ranks
        self.rank_in_group = ranks.index(rank)
        self.world_size = len(ranks)
        self.calls: list[str] = []

    def all_reduce(self, x: int) -> int:
        self.calls.append("all_reduce")
        return self._all_reduce_in_place(x)

    def _all_reduce_in_place(self, x: int) -> int:
        self.calls.append("_all_reduce_in_place")
        return x * 2

    def send(self, tensor: object, dst: int | None = None) -> None:
        self.calls.append("send")

    def recv(self, size: int, dtype: object, src: int | None = None) -> int:
        self.calls.append("recv")
        return size


def test_instrument_methods_counts_each_call_once_and_undoes_exactly() -> None:
    originals = {n: Coordinator.__dict__[n] for n in ("all_reduce", "_all_reduce_in_place")}
    undo = census.instrument_methods(
        Coordinator,
        {
            "all_reduce": "all_reduce",
            "_all_reduce_in_place": "all_reduce",
            "send": census.coordinator_p2p("send", "dst", 1),
            "recv": census.coordinator_p2p("recv", "src", 2),
        },
    )
    try:
        tp = Coordinator("tp:0", [4, 5, 6, 7], rank=5)
        assert tp.all_reduce(3) == 6  # the call still happens, with its result
        tp._all_reduce_in_place(1)  # entered directly (a custom op's implementation)
        tp.send(object())  # default peer: next rank in the group -> global 6
        tp.send(object(), dst=0)  # group-local 0 -> global 4
        tp.recv(8, None)  # default: previous rank -> global 4
        assert tp.calls.count("_all_reduce_in_place") == 2
        assert census.snapshot() == {
            ("tp:4-7", "all_reduce"): 2,
            ("tp:4-7", "send>6"): 1,
            ("tp:4-7", "send>4"): 1,
            ("tp:4-7", "recv<4"): 1,
        }
    finally:
        undo()
    assert {n: Coordinator.__dict__[n] for n in originals} == originals
    assert "send" in Coordinator.__dict__ and not hasattr(Coordinator.send, "__wrapped__")


def test_instrument_methods_skips_missing_and_inherited_is_restored() -> None:
    class Sub(Coordinator):
        pass

    undo = census.instrument_methods(Sub, ["all_reduce", "no_such_method"])
    assert "all_reduce" in Sub.__dict__
    Sub("pp:0", [0, 4], rank=0).all_reduce(1)
    undo()
    assert "all_reduce" not in Sub.__dict__
    assert census.snapshot() == {("pp:0,4", "all_reduce"): 1}


def test_patch_undo_restores_own_inherited_and_absent_attributes() -> None:
    class Base:
        def shared(self) -> str:
            return "base"

    class Sub(Base):
        def own(self) -> str:
            return "own"

    own, module = Sub.__dict__["own"], types.ModuleType("patched")
    undos = [patch(Sub, name, lambda self: "patched") for name in ("own", "shared", "absent")]
    undos.append(patch(module, "absent", 1))
    assert Sub().own() == Sub().shared() == Sub().absent() == "patched"  # type: ignore[attr-defined]
    undo_all(undos)()
    assert Sub.__dict__["own"] is own  # own: put back
    assert "shared" not in Sub.__dict__ and Sub().shared() == "base"  # inherited: deleted again
    assert not hasattr(Sub, "absent") and not hasattr(module, "absent")  # absent: removed
    undo_all(undos)()  # each patch undone once


def test_a_failing_group_reader_costs_the_count_not_the_call() -> None:
    def broken(_: object) -> str:
        raise KeyError("no ranks yet")

    undo = census.instrument_methods(Coordinator, ["all_reduce"], group_of=broken)
    try:
        assert Coordinator("tp:0", [0, 1], rank=0).all_reduce(2) == 4
    finally:
        undo()
    assert census.snapshot() == {}


# --- snapshots, dumps, signals -------------------------------------------------------------------


def test_tick_snapshots_every_n_rounds(recorder: Recorder, flight_dir: Path) -> None:
    census.configure(every=3)
    try:
        for _ in range(7):
            census.count("tp:0-1", "all_reduce")
            census.tick()
    finally:
        census.configure(every=snapshots.DEFAULT_EVERY)
    written = lines(flight_dir)
    assert [(x["kind"], x["round"]) for x in written] == [("census", 3), ("census", 6)]
    assert written[1]["counts"] == [["tp:0-1", "all_reduce", 6]]
    assert written[1]["every"] == 3 and written[1]["boot"] == "b1" and written[1]["rank"] == 0


def test_every_from_environment_rejects_nonsense() -> None:
    assert snapshots.every_from_env({"RANKSCOPE_CENSUS_EVERY": "10"}) == 10
    assert snapshots.every_from_env({"RANKSCOPE_CENSUS_EVERY": "0"}) == snapshots.DEFAULT_EVERY
    assert snapshots.every_from_env({"RANKSCOPE_CENSUS_EVERY": "x"}) == snapshots.DEFAULT_EVERY
    with pytest.raises(ValueError, match="positive"):
        census.configure(every=0)


def test_dump_local_writes_counts_without_a_peer(recorder: Recorder, flight_dir: Path) -> None:
    census.count("pp:0-1", "send>1", 2)
    assert census.dump_local("collective_failed") is True
    (dump,) = lines(flight_dir)
    assert dump["kind"] == "census_dump" and dump["reason"] == "collective_failed"
    assert dump["counts"] == [["pp:0-1", "send>1", 2]]


def test_snapshots_wait_for_a_configured_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "RECORDER", Recorder(flight_dir=None, boot="b"))
    census.count("tp:0-1", "all_reduce")
    assert census.dump_local() is False  # unarmed recorder: nothing written, nothing raised


SIGNAL_CHILD = """
import os, signal, sys, time
from rankscope.rank import census
from rankscope.rank.writer import RECORDER
RECORDER.configure(flight_dir=sys.argv[1], boot_id="sig", rank=int(sys.argv[2]))
census.configure(every=1)
census.count("world:0-1", "all_reduce", 7)
census.tick()  # installs the handlers on the main thread
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize(("sig", "reason"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGKILL, None)])
def test_sigterm_dumps_and_sigkill_leaves_the_last_snapshot(
    flight_dir: Path, sig: signal.Signals, reason: str | None
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_CHILD, str(flight_dir), "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(sig)
        assert child.wait(timeout=20) == -sig  # dies by the signal, as without the census
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    written = lines(flight_dir)
    assert written[0]["kind"] == "census" and written[0]["round"] == 1
    dumps = [x for x in written if x["kind"] == "census_dump"]
    if reason is None:
        assert dumps == []
    else:
        assert [(d["reason"], d["counts"]) for d in dumps] == [
            (reason, [["world:0-1", "all_reduce", 7]])
        ]


def test_previous_sigterm_handler_still_runs(flight_dir: Path) -> None:
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda s, f: (print('own handler', flush=True), "
        "sys.exit(3)))\n" + SIGNAL_CHILD
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(flight_dir), "1"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == 3
        assert "own handler" in child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    reasons = [x["reason"] for x in lines(flight_dir) if x["kind"] == "census_dump"]
    assert reasons == ["SIGTERM"]  # and no second dump at exit


# The main thread blocked where no Python runs, as in a hung collective: SIGTERM blocked on it
# (so the kernel hands the signal to another thread) while it sleeps in C.
BLOCKED_MAIN = """
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("blocked", flush=True)
time.sleep(float(sys.argv[3]))
"""


def start_signal_child(flight_dir: Path, program: str, *args: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", program, str(flight_dir), *args], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    for expected in [x for x in ("ready", "blocked") if f'print("{x}"' in program]:
        assert child.stdout.readline().strip() == expected
    return child


def test_sigterm_ends_a_blocked_main_thread_at_once_and_dumps(flight_dir: Path) -> None:
    """Without rankscope SIGTERM's default action ends a process whatever its main thread is
    doing; a Python handler alone would wait for the main thread (here 60 s)."""
    program = SIGNAL_CHILD.replace("time.sleep(30)", BLOCKED_MAIN)
    child = start_signal_child(flight_dir, program, "0", "60")
    try:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    dumps = [x for x in lines(flight_dir) if x["kind"] == "census_dump"]
    assert [(d["reason"], d["counts"]) for d in dumps] == [
        ("SIGTERM", [["world:0-1", "all_reduce", 7]])
    ]


OWN_HANDLER = (
    "signal.signal(signal.SIGTERM, lambda s, f: (print('own handler', flush=True), sys.exit(3)))\n"
)


@pytest.mark.parametrize("installed", ["before", "after"])
def test_a_programs_handler_still_decides_when_its_main_thread_is_blocked(
    flight_dir: Path, installed: str
) -> None:
    """A handler the program set before the census's is called after the dump; one it set
    after replaces the census's, relay included. Either ends the process as the program says
    (here: exit 3), never by the signal's default action."""
    program = SIGNAL_CHILD.replace("time.sleep(30)", BLOCKED_MAIN)
    before, after = "census.tick()", 'print("ready"'
    where = before if installed == "before" else after
    program = "import signal, sys\n" + program.replace(where, OWN_HANDLER + where)
    child = start_signal_child(flight_dir, program, "0", "4")
    try:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == 3
        assert child.stdout is not None and child.stdout.read() == "own handler\n"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    reasons = [x["reason"] for x in lines(flight_dir) if x["kind"] == "census_dump"]
    assert reasons == (["SIGTERM"] if installed == "before" else ["exit"])


def test_a_forked_childs_sigterm_is_its_own(flight_dir: Path) -> None:
    """A child forked after the handlers are installed shares the parent's wakeup pipe unless
    it lets it go: its SIGTERM would then end the parent."""
    program = SIGNAL_CHILD.replace(
        "time.sleep(30)",
        """
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
time.sleep(0.5)
os.kill(pid, signal.SIGTERM)
print("child", os.waitpid(pid, 0)[1], flush=True)
time.sleep(1.0)  # time for a relayed SIGTERM to end this process
print("parent alive", flush=True)
""",
    )
    child = start_signal_child(flight_dir, program, "0")
    try:
        assert child.wait(timeout=20) == 0
        assert child.stdout is not None
        assert child.stdout.read() == f"child {signal.SIGTERM}\nparent alive\n"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    reasons = [x["reason"] for x in lines(flight_dir) if x["kind"] == "census_dump"]
    assert sorted(reasons) == ["SIGTERM", "exit"]  # the child's dump, and the parent's at exit


@pytest.mark.parametrize(("end", "status"), [("SIGTERM", -signal.SIGTERM), ("exit", 0)])
def test_a_relay_that_cannot_start_costs_a_log_line_not_the_handlers(
    flight_dir: Path, end: str, status: int
) -> None:
    """No thread to be had: install goes on with the main thread's handler, SIGTERM still dumps
    and ends the process by the signal, a plain exit still dumps at exit (no relay to stop), and
    nothing but the log line reaches stderr."""
    refuse = "def refuse(self): raise RuntimeError('no thread')\nthreading.Thread.start = refuse\n"
    program = "import threading\n" + refuse + SIGNAL_CHILD
    if end == "exit":
        program = program.replace("time.sleep(30)", "pass")
    child = subprocess.Popen(
        [sys.executable, "-c", program, str(flight_dir), "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        if end == "SIGTERM":
            child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == status
        assert child.stderr is not None
        logged = [line for line in child.stderr.read().splitlines() if line.strip()]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert len(logged) == 1 and "signal relay" in logged[0], logged
    reasons = [x["reason"] for x in lines(flight_dir) if x["kind"] == "census_dump"]
    assert reasons == [end]


def test_each_failure_category_logs_its_first(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(counts, "_warned", set())
    for category in ("count", "count", "dump"):
        counts.failed(category, ValueError("boom"), "tp:0-1")
    assert [r.getMessage().split(" failed")[0] for r in caplog.records] == [
        "rankscope census: a count",
        "rankscope census: a dump",
    ]
