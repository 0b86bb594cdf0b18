"""The pure parts of zero-touch arming: the graph pool's bytes from an allocator snapshot,
the switches read from the environment, and the environment `rankscope run` hands on.
The processes themselves are tested in tests/test_run.py."""

from __future__ import annotations

import math

import pytest

from rankscope import auto, run
from rankscope.census import snapshots
from rankscope.probe import samples

# The shape of torch.cuda.memory._snapshot()["segments"] (trimmed): two graph pools and the
# default pool (0, 0).
SEGMENTS = [
    {"total_size": 2 << 20, "segment_pool_id": (0, 0)},
    {"total_size": 20 << 20, "segment_pool_id": (1, 3)},
    {"total_size": 2 << 20, "segment_pool_id": (1, 3)},
    {"total_size": 8 << 20, "segment_pool_id": (1, 5)},
    {"total_size": 1 << 20},  # an older torch without pool ids: in no graph pool
]


def test_pool_bytes_sums_the_segments_of_one_pool() -> None:
    assert auto.pool_bytes(SEGMENTS, (1, 3)) == 22 << 20
    assert auto.pool_bytes(SEGMENTS, [1, 5]) == 8 << 20
    assert auto.pool_bytes(SEGMENTS, (9, 9)) == 0
    assert auto.pool_bytes([], (1, 3)) == 0


@pytest.mark.parametrize(
    ("value", "armed"),
    [("1", True), ("yes", True), ("", False), ("0", False), ("off", False), ("FALSE", False)],
)
def test_rankscope_auto_switch(value: str, armed: bool) -> None:
    assert auto.enabled({"RANKSCOPE_AUTO": value}) is armed


def test_sample_interval_from_the_environment() -> None:
    assert samples.every_from_env({}) == samples.DEFAULT_EVERY_S
    assert samples.every_from_env({"RANKSCOPE_SAMPLE_EVERY": "0.5"}) == 0.5
    assert samples.every_from_env({"RANKSCOPE_SAMPLE_EVERY": "0"}) == 0
    for bad in ("-1", "nan", "inf", "soon"):
        value = samples.every_from_env({"RANKSCOPE_SAMPLE_EVERY": bad})
        assert value == samples.DEFAULT_EVERY_S and math.isfinite(value)


def test_run_environment_one_boot_and_the_switches(tmp_path) -> None:
    env = run.child_environment({"PATH": "/bin"}, str(tmp_path), None, census=True, compare=False)
    assert env["RANKSCOPE_AUTO"] == "1"
    assert env["RANKSCOPE_DIR"] == str(tmp_path.resolve())
    assert env["RANKSCOPE_BOOT_ID"]  # derived from this process: one per run
    assert "RANKSCOPE_CENSUS" not in env and "RANKSCOPE_COMPARE" not in env
    given = run.child_environment(
        {"RANKSCOPE_BOOT_ID": "inherited"}, "d", "mine", census=False, compare=True
    )
    assert given["RANKSCOPE_BOOT_ID"] == "mine"
    assert (given["RANKSCOPE_CENSUS"], given["RANKSCOPE_COMPARE"]) == ("0", "1")
    inherited = run.child_environment(
        {"RANKSCOPE_BOOT_ID": "inherited"}, "d", None, census=True, compare=False
    )
    assert inherited["RANKSCOPE_BOOT_ID"] == "inherited"


def test_an_explicit_tick_stops_the_automatic_cadence() -> None:
    state = snapshots.STATE
    saved = (state.round, state.every, state.auto_every, state.explicit)
    try:
        snapshots.reset()
        snapshots.configure(auto_every=7)
        assert state.every == 7
        for _ in range(3):
            snapshots.auto_tick()
        assert state.round == 3
        snapshots.tick()  # a framework's tick: it drives the rounds from now on
        assert state.round == 4 and state.every == snapshots.every_from_env()
        snapshots.auto_tick()
        assert state.round == 4
    finally:
        state.round, state.every, state.auto_every, state.explicit = saved


def test_optional_parts_cost_a_line_never_the_arming(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="rankscope.auto"):
        auto._optional("rankscope.no_such_part", "install")  # absent: a debug line
        auto._optional("json", "no_such_function")  # broken: one warning
    levels = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels == [
        ("DEBUG", "rankscope"),
        ("WARNING", "rankscope"),
    ], caplog.records
    assert "json.no_such_function() failed" in caplog.records[1].getMessage()
