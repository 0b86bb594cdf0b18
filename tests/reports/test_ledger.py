"""The ledger (posts, per-card identity, the phases document) on fixture records, and the
`rankscope boots` / `rankscope phases` commands run as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rankscope.procfs import HOST_PIDNS_INODE
from rankscope.record import (
    SCHEMA_VERSION,
    Header,
    Line,
    Mark,
    MarkDerived,
    MarkDevice,
    MarkDriver,
    MarkNvml,
    MarkTorch,
)
from rankscope.record.reader import read_flight
from rankscope.reports.ledger import card_identities, phases_document, posts

MiB = 1 << 20
GiB = 1 << 30
CARD = "GPU-aaaa"
OTHER_CARD = "GPU-bbbb"
TOTAL = 80 * GiB


def mark(
    phase: str,
    wall: float,
    *,
    pid: int = 10,
    boot: str = "b1",
    runner: str | None = "target",
    reserved: int | None = None,
    allocated: int | None = None,
    free: int | None = None,
    self_bytes: int | None = None,
    procs: Mapping[str, int | None] | None = None,
    card: str | None = CARD,
    gpu: int | None = 0,
    pidns: int = HOST_PIDNS_INODE,
    rank: int | None = 0,
) -> Line[Mark]:
    """A mark as the probe writes it (docs/probe.md), built from the writer's types."""
    non_torch = self_bytes - reserved if self_bytes is not None and reserved is not None else None
    header = Header(
        v=SCHEMA_VERSION,
        kind=Mark.KIND,
        boot=boot,
        rank=rank,
        local_rank=rank,
        world_size=2,
        tp_rank=0,
        pp_rank=rank,
        runner=runner,
        host="h",
        pid=pid,
        start_ticks=500 + pid,
        nspid=(pid,),
        pidns=pidns,
        mono=wall,
        wall=wall,
    )
    body = Mark(
        phase=phase,
        device=MarkDevice(index=0, uuid=card, nvml_index=gpu),
        torch=MarkTorch(
            reserved=reserved,
            allocated=allocated,
            peak_allocated=allocated,
            num_alloc_retries=0,
            num_ooms=0,
        ),
        driver=MarkDriver(free=free, total=TOTAL if free is not None else None),
        nvml=MarkNvml(
            self_bytes=self_bytes,
            procs={int(p): used for p, used in procs.items()} if procs is not None else None,
        ),
        derived=MarkDerived(non_torch=non_torch, non_torch_measured=non_torch is not None),
    )
    return Line(header, body)


# --- posts ----------------------------------------------------------------------------------


def test_posts_are_signed_differences_per_process_and_runner() -> None:
    recs = [
        mark("pre_weight_load", 1, reserved=0, allocated=0, free=79 * GiB, self_bytes=500 * MiB),
        mark(
            "weights_loaded",
            2,
            reserved=16 * GiB,
            allocated=15 * GiB,
            free=63 * GiB,
            self_bytes=16 * GiB + 500 * MiB,
        ),
        # The draft runner runs the same phases in the same process: kept apart.
        mark(
            "capture_begin",
            3,
            runner="draft",
            reserved=16 * GiB,
            free=63 * GiB,
            self_bytes=16 * GiB + 500 * MiB,
        ),
        mark(
            "capture_begin",
            4,
            reserved=16 * GiB,
            allocated=15 * GiB,
            free=63 * GiB,
            self_bytes=16 * GiB + 500 * MiB,
        ),
        mark(
            "capture_end",
            5,
            runner="draft",
            reserved=16 * GiB + 100 * MiB,
            free=62 * GiB,
            self_bytes=17 * GiB,
        ),
        mark(
            "capture_end", 6, reserved=15 * GiB, allocated=14 * GiB, free=62 * GiB, self_bytes=None
        ),
    ]
    got = posts(recs)
    assert [(p["runner"], p["post"]) for p in got] == [
        ("target", "pre_weight_load->weights_loaded"),
        ("target", "weights_loaded->capture_begin"),
        ("draft", "capture_begin->capture_end"),
        ("target", "capture_begin->capture_end"),
    ]
    weights, _, draft_capture, target_capture = got
    assert weights["views"] == {
        "allocator": 16 * GiB,
        "allocated": 15 * GiB,
        "driver": 16 * GiB,
        "process": 16 * GiB,
        "non_torch": 0,
    }
    assert (weights["since"], weights["phase"], weights["seconds"]) == (
        "pre_weight_load",
        "weights_loaded",
        1,
    )
    assert (weights["uuid"], weights["gpu"], weights["pid"]) == (CARD, 0, 10)
    assert draft_capture["views"]["allocator"] == 100 * MiB
    assert draft_capture["views"]["allocated"] is None  # unmeasured at both draft marks
    # Shrinking is a negative post; an unmeasured side makes the post null, never 0.
    assert target_capture["views"]["allocator"] == -1 * GiB
    assert target_capture["views"]["process"] is None
    assert target_capture["views"]["non_torch"] is None


def test_posts_never_cross_a_boot_seam_or_a_change_of_card() -> None:
    recs = [
        mark("a", 1, reserved=1 * GiB),
        mark("b", 2, reserved=2 * GiB),
        mark("c", 3, reserved=9 * GiB, boot="b2"),  # the same process re-configured its boot
        mark("d", 4, reserved=10 * GiB, boot="b2"),
        mark("e", 5, reserved=10 * GiB, boot="b2", card=OTHER_CARD),
        mark("f", 6, reserved=11 * GiB, boot="b2", card=OTHER_CARD),
    ]
    assert [(p["boot"], p["post"], p["views"]["allocator"]) for p in posts(recs)] == [
        ("b1", "a->b", 1 * GiB),
        ("b2", "c->d", 1 * GiB),
        ("b2", "e->f", 1 * GiB),
    ]


def test_processes_sharing_a_rank_keep_their_own_posts() -> None:
    recs = [
        mark(p, w, pid=pid, rank=0, reserved=w * GiB)
        for w, (pid, p) in enumerate(
            [(10, "a"), (11, "a"), (12, "a"), (10, "b"), (11, "b"), (12, "b")]
        )
    ]
    got = posts(recs)
    assert sorted((p["pid"], p["post"], p["views"]["allocator"]) for p in got) == [
        (10, "a->b", 3 * GiB),
        (11, "a->b", 3 * GiB),
        (12, "a->b", 3 * GiB),
    ]


# --- per-card identity ----------------------------------------------------------------------


def test_card_identity_splits_the_card_and_reports_drift() -> None:
    procs_1 = {"10": 2 * GiB, "11": 3 * GiB, "77": 4 * GiB}
    procs_2 = {"10": 6 * GiB, "11": 3 * GiB, "77": 4 * GiB, "78": 1 * GiB}
    recs = [
        mark("a", 1, pid=10, free=70 * GiB, procs=procs_1),
        mark("a", 2, pid=11, free=70 * GiB, procs=procs_1, rank=1),
        mark("b", 3, pid=10, free=65 * GiB, procs=procs_2),
        mark("c", 4, pid=10, free=None, procs=procs_2),  # no driver view: no identity
        mark("d", 5, pid=10, free=65 * GiB, procs={"10": None, "77": 4 * GiB}),
    ]
    (card,) = card_identities(recs)
    assert (card["uuid"], card["gpu"]) == (CARD, 0)
    first, second, third, unknown = card["identities"]
    # 80 = (2 + 3) rank-resident + 4 foreign + 70 free + 1 unattributed
    assert (first["rank_resident"], first["foreign"], first["free"], first["unattributed"]) == (
        5 * GiB,
        4 * GiB,
        70 * GiB,
        1 * GiB,
    )
    assert first["drift"] == 0 and second["drift"] == 0
    assert third["foreign"] == 5 * GiB and third["foreign_pids"] == {"77": 4 * GiB, "78": 1 * GiB}
    # 80 - 9 - 5 - 65 = 1: unchanged, no drift
    assert (third["rank_resident"], third["unattributed"], third["drift"]) == (9 * GiB, 1 * GiB, 0)
    for row in (first, second, third):
        assert (
            row["total"]
            == row["rank_resident"] + row["foreign"] + row["free"] + row["unattributed"]
        )
    # A pid of unknown size makes its sum, and the remainder, unknown: not 0.
    assert unknown["rank_resident"] is None and unknown["unattributed"] is None
    assert unknown["drift"] is None and unknown["foreign"] == 4 * GiB


def test_identity_drift_is_signed() -> None:
    procs = {"10": 2 * GiB}
    recs = [
        mark("a", 1, free=77 * GiB, procs=procs),  # unattributed 1 GiB
        mark("b", 2, free=78 * GiB + 512 * MiB, procs=procs),  # unattributed -0.5 GiB
    ]
    (card,) = card_identities(recs)
    assert [i["unattributed"] for i in card["identities"]] == [1 * GiB, -512 * MiB]
    assert [i["drift"] for i in card["identities"]] == [0, -1536 * MiB]


def test_a_namespaced_rank_is_unresolved_without_the_daemons_view() -> None:
    recs = [mark("a", 1, pid=1, pidns=4026532999, free=70 * GiB, procs={"4242": 5 * GiB})]
    (card,) = card_identities(recs)
    (row,) = card["identities"]
    # pid 1 in its namespace is not NVML's 4242: the offline ledger cannot tell, and says so.
    assert (row["rank_resident"], row["foreign"], row["unresolved_processes"]) == (0, 5 * GiB, 1)
    (card,) = card_identities(recs, resolve_host_pid=lambda rec: 4242)  # the daemon's resolver
    (row,) = card["identities"]
    assert (row["rank_resident"], row["foreign"], row["unresolved_processes"]) == (5 * GiB, 0, 0)


# --- the document and the commands ----------------------------------------------------------


def write_flight(directory: Path, recs: list[Line[Mark]]) -> None:
    for rec in recs:
        h = rec.header
        name = f"marks-{h.host}-{h.pid}-{h.start_ticks}.jsonl"
        with open(directory / name, "a") as f:
            f.write(json.dumps({**h.to_json(), **rec.body.to_json()}) + "\n")


def fixture_flight(directory: Path) -> None:
    """Two boots. In b1, rank 0 (pid 10) on card 0 next to a foreign process (pid 77, 4 GiB)
    and rank 1 (pid 11) alone on card 1; each loads 16 GiB of weights. The driver keeps
    500 MiB of each card unattributed, and 8 MiB more of card 1 after the load."""
    ctx = 600 * MiB
    weights = 16 * GiB
    unattributed = 500 * MiB
    common: dict[str, Any] = {"allocated": None}
    records = [
        mark(
            "pre_weight_load",
            1,
            boot="old",
            reserved=0,
            free=79 * GiB,
            self_bytes=ctx,
            procs={"10": ctx},
        ),
        mark(
            "weights_loaded",
            2,
            boot="old",
            reserved=GiB,
            free=78 * GiB,
            self_bytes=GiB + ctx,
            procs={"10": GiB + ctx},
        ),
    ]
    for pid, rank, card, gpu, foreign, extra_unattributed in (
        (10, 0, CARD, 0, {"77": 4 * GiB}, 0),
        (11, 1, OTHER_CARD, 1, {}, 8 * MiB),
    ):
        held = sum(foreign.values())
        before = {str(pid): ctx, **foreign}
        after = {str(pid): ctx + weights, **foreign}
        ident: dict[str, Any] = {"pid": pid, "rank": rank, "card": card, "gpu": gpu, **common}
        records.append(
            mark(
                "pre_weight_load",
                10 + pid,
                reserved=0,
                free=TOTAL - ctx - held - unattributed,
                self_bytes=ctx,
                procs=before,
                **ident,
            )
        )
        records.append(
            mark(
                "weights_loaded",
                20 + pid,
                reserved=weights,
                free=TOTAL - ctx - weights - held - unattributed - extra_unattributed,
                self_bytes=ctx + weights,
                procs=after,
                **ident,
            )
        )
    write_flight(directory, records)
    with open(directory / "marks-h-11-511.jsonl", "a") as f:
        f.write('{"v": 1, "kind": "mark", "boot": "b1"')  # torn by a crash


def test_the_phases_document(flight_dir: Path) -> None:
    fixture_flight(flight_dir)
    doc = phases_document(read_flight(flight_dir))
    assert doc["boot"] == "b1"
    assert doc["skipped"] == {
        "torn": 1,
        "malformed": 0,
        "newer_schema": 0,
        "oversized": 0,
        "too_deep": 0,
    }
    assert [(p["pid"], p["rank"]) for p in doc["processes"]] == [(10, 0), (11, 1)]
    p10 = doc["processes"][0]
    assert [m["phase"] for m in p10["marks"]] == ["pre_weight_load", "weights_loaded"]
    assert p10["marks"][1]["process_bytes"] == 16 * GiB + 600 * MiB
    (post,) = p10["posts"]
    assert post["views"]["allocator"] == 16 * GiB and post["views"]["driver"] == 16 * GiB
    assert post["views"]["allocated"] is None
    assert [c["gpu"] for c in doc["cards"]] == [0, 1]
    card0, card1 = (c["identities"] for c in doc["cards"])
    assert [i["rank_resident"] for i in card0] == [600 * MiB, 16 * GiB + 600 * MiB]
    assert [i["foreign"] for i in card0] == [4 * GiB, 4 * GiB]
    assert [i["foreign_pids"] for i in card0] == [{"77": 4 * GiB}] * 2
    assert [(i["unattributed"], i["drift"]) for i in card0] == [(500 * MiB, 0)] * 2
    assert [(i["unattributed"], i["drift"]) for i in card1] == [
        (500 * MiB, 0),
        (508 * MiB, 8 * MiB),
    ]
    assert [i["foreign"] for i in card1] == [0, 0]
    assert json.loads(json.dumps(doc)) == doc


def test_a_process_takes_its_rank_from_its_first_ranked_mark(flight_dir: Path) -> None:
    """A rank started by multiprocessing.spawn marks process_start before init tells it its
    rank: it is that rank all the same, not a process with no rank."""
    write_flight(
        flight_dir,
        [
            mark("process_start", 1, pid=20, rank=None),
            mark("nccl_init_end", 2, pid=20, rank=1),
        ],
    )
    (process,) = phases_document(read_flight(flight_dir))["processes"]
    assert (process["pid"], process["rank"], process["pp_rank"]) == (20, 1, 1)
    assert [m["phase"] for m in process["marks"]] == ["process_start", "nccl_init_end"]


def rankscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *args], capture_output=True, text=True, timeout=60
    )


def test_rankscope_boots_and_phases(flight_dir: Path) -> None:
    fixture_flight(flight_dir)
    boots = rankscope("boots", str(flight_dir))
    assert boots.returncode == 0, boots.stderr
    lines = boots.stdout.splitlines()
    assert lines[0].split()[:2] == ["boot", "first"]
    assert lines[1].split()[0] == "old" and not lines[1].endswith("latest")
    assert lines[2].split()[0] == "b1" and lines[2].endswith("latest")
    assert "1 torn" in boots.stdout
    listed = json.loads(rankscope("boots", str(flight_dir), "--json").stdout)
    assert [(b["boot"], b["processes"], b["ranks"], b["latest"]) for b in listed["boots"]] == [
        ("old", 1, [0], False),
        ("b1", 2, [0, 1], True),
    ]

    table = rankscope("phases", str(flight_dir))
    assert table.returncode == 0, table.stderr
    out = table.stdout
    assert out.startswith("boot b1: 2 processes")
    rows = [line.split() for line in out.splitlines() if "pre_weight_load->weights_loaded" in line]
    # reserved, allocated, driver, process, non-torch side by side, in MiB
    assert [row[-5:] for row in rows] == [
        ["+16384.0", "n/a", "+16384.0", "+16384.0", "+0.0"],
        ["+16384.0", "n/a", "+16392.0", "+16384.0", "+0.0"],
    ]
    assert "card gpu 0 GPU-aaaa" in out and "card gpu 1 GPU-bbbb" in out
    identities = [line.split() for line in out.splitlines() if line.startswith("  weights_loaded")]
    # pid, total, rank-resident, foreign, free, unattributed, drift
    assert [row[1:] for row in identities] == [
        ["10", "81920.0", "16984.0", "4096.0", "60340.0", "+500.0", "+0.0"],
        ["11", "81920.0", "16984.0", "0.0", "64428.0", "+508.0", "+8.0"],
    ]
    assert "foreign pids seen: 77" in out
    as_json = json.loads(rankscope("phases", str(flight_dir), "--json").stdout)
    assert as_json == phases_document(read_flight(flight_dir))
    old = json.loads(rankscope("phases", str(flight_dir), "--boot", "old", "--json").stdout)
    assert old["boot"] == "old" and [p["pid"] for p in old["processes"]] == [10]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["phases", "{dir}", "--boot", "nope"],
            "no boot 'nope' in the flight directory (boots recorded: old, b1)",
        ),
        (["phases", "{dir}/missing"], "does not exist"),
        (["boots", "{dir}/missing"], "does not exist"),
    ],
)
def test_rankscope_phases_errors_are_clear(flight_dir: Path, args: list[str], message: str) -> None:
    fixture_flight(flight_dir)
    proc = rankscope(*(a.format(dir=flight_dir) for a in args))
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stdout == ""


def test_rankscope_phases_on_records_of_real_probe_processes(flight_dir: Path) -> None:
    # Real processes on this GPU-less machine: every CUDA field is null, and the table says why.
    code = """
        from rankscope.rank import probe
        probe.configure(tp_rank=0)
        probe.mark("pre_weight_load")
        probe.mark("weights_loaded")
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "TORCHELASTIC"))}
    env["RANKSCOPE_BOOT_ID"] = "cpu-run"
    env["RANKSCOPE_DIR"] = str(flight_dir)
    for rank in range(3):
        subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=dict(env, RANK=str(rank)),
            check=True,
            timeout=60,
        )
    out = rankscope("phases", str(flight_dir)).stdout
    assert out.startswith("boot cpu-run: 3 processes")
    assert out.count("\nprocess pid ") == 3
    assert out.count("pre_weight_load->weights_loaded") == 3
    assert "n/a at pre_weight_load, weights_loaded: torch is not imported in this process" in out
