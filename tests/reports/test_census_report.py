"""The census report and `rankscope census`, on flight directories written by the real
recorder (one Recorder per fake rank process) and read by the real flight reader."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.recorders import rank_recorder

from rankscope.cli import build_parser
from rankscope.cli.census import main as census_main
from rankscope.cli.census import render_text
from rankscope.rank.writer import Recorder
from rankscope.record import SCHEMA_VERSION, Census, CensusDump, Divergence, Header, Line, Mark
from rankscope.record.reader import read_flight
from rankscope.reports.census import build_report, census_document

CountsAt = Callable[[int, int], dict[tuple[str, str], int]]  # (rank, round) -> counts


def write_rounds(rec: Recorder, rank: int, rounds: range, counts_at: CountsAt) -> None:
    for r in rounds:
        assert rec.write_record(Census(round=r, every=10, counts=counts_at(rank, r)))


def report_of(flight_dir: Path, boot: str | None = None) -> dict[str, Any]:
    return census_document(read_flight(flight_dir, boot=boot))


def skip_then_extra(rank: int, r: int) -> dict[tuple[str, str], int]:
    """Rank 2 skips the all_reduce of tick 37 and issues one extra at tick 73."""
    n = r - 1 if rank == 2 and 37 <= r < 73 else r
    return {("world:0-2", "all_reduce"): n, ("world:0-2", "barrier"): 1}


def test_a_divergence_that_heals_stays_in_the_history(flight_dir: Path) -> None:
    for rank in range(3):
        write_rounds(rank_recorder(flight_dir, rank), rank, range(10, 101, 10), skip_then_extra)
    report = report_of(flight_dir)
    assert report["boot"] == "b1" and report["every"] == 10
    assert report["divergent"] is False
    latest = {e["op"]: e for e in report["entries"]}
    assert latest["all_reduce"]["counts"] == {"0": 100, "1": 100, "2": 100}
    assert latest["all_reduce"]["round"] == 100
    assert report["first_divergent_round"] == 40
    assert report["history"] == [
        {
            "group": "world:0-2",
            "op": "all_reduce",
            "counts": {"0": 40, "1": 40, "2": 39},
            "divergent": True,
            "lagging": [2],
            "round": 40,
            "rounds": [40, 70],
            "resolved": True,
        }
    ]


def test_a_divergence_whose_lagging_rank_changes_is_two_in_the_history(flight_dir: Path) -> None:
    def counts_at(rank: int, r: int) -> dict[tuple[str, str], int]:
        behind = (rank == 2 and 40 <= r < 60) or (rank == 1 and 60 <= r < 80)
        return {("world:0-2", "all_reduce"): r - behind}

    for rank in range(3):
        write_rounds(rank_recorder(flight_dir, rank), rank, range(10, 101, 10), counts_at)
    history = report_of(flight_dir)["history"]
    assert [(e["lagging"], e["rounds"], e["resolved"]) for e in history] == [
        ([2], [40, 50], True),
        ([1], [60, 70], True),
    ]


def test_a_sigkilled_rank_counts_with_its_last_snapshot(flight_dir: Path) -> None:
    def counts_at(rank: int, r: int) -> dict[tuple[str, str], int]:
        lag = 1 if rank == 1 and r >= 50 else 0
        return {("world:0-2", "broadcast"): r - lag}

    write_rounds(rank_recorder(flight_dir, 0), 0, range(10, 61, 10), counts_at)  # killed
    for rank in (1, 2):
        write_rounds(rank_recorder(flight_dir, rank), rank, range(10, 71, 10), counts_at)
    report = report_of(flight_dir)
    (entry,) = report["entries"]
    assert entry["round"] == 60
    assert entry["counts"] == {"0": 60, "1": 59, "2": 60}
    assert entry["divergent"] is True and entry["lagging"] == [1]
    assert report["divergent"] is True and report["first_divergent_round"] == 50
    assert report["history"][0]["resolved"] is False
    assert [r["last_round"] for r in report["ranks"]] == [60, 70, 70]


def test_group_instances_compare_only_their_members(flight_dir: Path) -> None:
    def counts_at(rank: int, r: int) -> dict[tuple[str, str], int]:
        tp = "tp:0-1" if rank < 2 else "tp:2-3"
        out = {(tp, "all_reduce"): r * (2 if rank >= 2 else 1)}
        if rank == 3 and r == 20:
            out[(tp, "all_reduce")] -= 1
        if rank == 0:
            out[("pp:0,2", "send>2")] = r
        if rank == 2:
            out[("pp:0,2", "recv<0")] = r - (1 if r == 20 else 0)
        if rank == 1 and r == 20:
            out[("tp:0-1", "all_gather")] = 1  # rank 0 never issued one: counts as zero
        return out

    for rank in range(4):
        write_rounds(rank_recorder(flight_dir, rank), rank, range(10, 21, 10), counts_at)
    entries = {(e["group"], e["op"]): e for e in report_of(flight_dir)["entries"]}
    assert entries[("tp:0-1", "all_reduce")]["counts"] == {"0": 20, "1": 20}
    assert entries[("tp:0-1", "all_gather")]["counts"] == {"0": 0, "1": 1}
    assert entries[("tp:0-1", "all_gather")]["lagging"] == [0]
    assert entries[("tp:2-3", "all_reduce")]["lagging"] == [3]
    assert entries[("pp:0,2", "p2p 0>2")]["counts"] == {"0": 20, "2": 19}
    assert entries[("pp:0,2", "p2p 0>2")]["lagging"] == [2]


def test_a_p2p_op_has_one_name_in_the_document_and_the_text(flight_dir: Path) -> None:
    """Rank 0's `send>2` and rank 2's `recv<0` are one channel: the document names it
    `p2p 0>2` in the ranks' counts as in the entries, and the text never says `send>`."""

    def counts_at(rank: int, r: int) -> dict[tuple[str, str], int]:
        if rank == 0:
            return {("pp:0,2", "send>2"): r}
        return {("pp:0,2", "recv<0"): r - 1}

    for rank in (0, 2):
        write_rounds(rank_recorder(flight_dir, rank), rank, range(10, 21, 10), counts_at)
    report = report_of(flight_dir)
    rank_ops = {(r["rank"], op): n for r in report["ranks"] for _, op, n in r["counts"]}
    assert rank_ops == {(0, "p2p 0>2"): 20, (2, "p2p 0>2"): 19}
    entry_ops = {e["op"] for e in [*report["entries"], *report["history"]]}
    assert entry_ops == {"p2p 0>2"}
    text = json.dumps(report) + render_text(report)
    assert "send>" not in text and "recv<" not in text


def test_dumps_in_process_lines_and_torn_lines(flight_dir: Path) -> None:
    recs = [rank_recorder(flight_dir, r) for r in range(2)]
    for rank, rec in enumerate(recs):
        rec.write_record(Census(round=10, every=10, counts={("tp:0-1", "all_reduce"): 10}))
        counts = {("tp:0-1", "all_reduce"): 12 - rank}
        rec.write_record(CensusDump(round=12, every=None, counts=counts, reason="SIGTERM"))
    recs[0].write_record(
        Divergence(round=10, group="tp:0-1", op="all_reduce", counts={0: 10, 1: 9}, lagging=(1,))
    )
    path = recs[1].path_for("census")
    assert path is not None
    with path.open("a") as f:
        f.write('{"v": 1, "kind": "census", "round": 2')  # a torn last line
    report = report_of(flight_dir)
    assert report["dumps"]["ranks"][1]["reason"] == "SIGTERM"
    (dumped,) = report["dumps"]["entries"]
    assert dumped["counts"] == {"0": 12, "1": 11} and dumped["lagging"] == [1]
    assert report["in_process"][0]["lagging"] == [1] and report["in_process_lines"] == 1
    assert report["skipped"] == {"torn": 1}
    text = render_text(report)
    assert "rank 1: SIGTERM at round 12" in text and "skipped: torn 1" in text


def test_records_without_a_rank_or_with_bad_counts_are_counted() -> None:
    def header(kind: str, rank: int | None) -> Header:
        return Header(v=SCHEMA_VERSION, kind=kind, boot="b", host="h", pid=1, wall=1.0, rank=rank)

    report = build_report(
        [
            Line(header("census", None), Census(round=10, every=None, counts={})),
            # counts the parse could not read (a row of "many" collectives) are None
            Line(header("census", 0), Census(round=10, every=None, counts=None)),
            Line(header("mark", 0), Mark("p")),
        ]
    )
    assert report["skipped"] == {"bad_census_line": 1, "no_rank": 1}
    assert report["entries"] == [] and report["divergent"] is False


def test_cli_prints_the_table_and_exits_1_on_divergence(
    flight_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def counts_at(rank: int, r: int) -> dict[tuple[str, str], int]:
        return {("world:0-2", "all_reduce"): r - (1 if rank == 2 and r >= 30 else 0)}

    for rank in range(3):
        write_rounds(
            rank_recorder(flight_dir, rank, boot="old"),
            rank,
            range(10, 21, 10),
            lambda rank, r: {("world:0-2", "all_reduce"): r},
        )
        write_rounds(
            rank_recorder(flight_dir, rank, pid=2000 + rank), rank, range(10, 41, 10), counts_at
        )
    args = build_parser(["census", str(flight_dir)]).parse_args(["census", str(flight_dir)])
    assert census_main(args) == 1
    out = capsys.readouterr().out
    assert "world:0-2  all_reduce  40" in out
    assert "0:40 1:40 2:39" in out and "DIVERGENT, lagging: 2" in out
    assert "first divergence at round 30" in out
    argv = ["census", str(flight_dir), "--boot", "old"]
    assert census_main(build_parser(argv).parse_args(argv)) == 0
    assert "no divergence at any compared round" in capsys.readouterr().out
    argv = ["census", str(flight_dir), "--boot", "nope"]
    assert census_main(build_parser(argv).parse_args(argv)) == 2
    assert "no boot 'nope'" in capsys.readouterr().err


def test_cli_json_as_a_real_command(flight_dir: Path) -> None:
    for rank in range(3):
        write_rounds(rank_recorder(flight_dir, rank), rank, range(10, 101, 10), skip_then_extra)
    out = subprocess.run(
        [sys.executable, "-m", "rankscope", "census", str(flight_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["first_divergent_round"] == 40
    assert doc["history"][0]["rounds"] == [40, 70] and doc["history"][0]["lagging"] == [2]


# --- the seam between the reading half and the in-rank half ---------------------------------

IN_RANK = (
    "rankscope.rank.census.counts",
    "rankscope.rank.census.torch_patch",
    "rankscope.rank.census.wrap",
    "rankscope.rank.census.graphs",
    "rankscope.rank.census.snapshots",
    "rankscope.rank.census.gloo",
)


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_the_daemon_reads_census_records_without_loading_torch_or_the_patching_code() -> None:
    loaded = loaded_after(
        "import rankscope.daemon.app, rankscope.daemon.cli\n"
        "from rankscope import census\n"
        "from rankscope.reports.census import census_document\n"
        "from rankscope.cli.census import main"
    )
    assert "torch" not in loaded
    assert loaded.isdisjoint(IN_RANK), sorted(loaded & set(IN_RANK))
    # The check sees the patch module when it is loaded: the public API still reaches it.
    used = loaded_after("from rankscope import census\ncensus.instrument_torch_distributed")
    assert "rankscope.rank.census.torch_patch" in used and "torch" not in used
