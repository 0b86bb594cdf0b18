"""Two-GPU-shaped NCCL RAS reports, EDITED from the real one-GPU 2.28.9 reports (the lent GPU
machine has one GPU, so a real mismatch or dead peer cannot be captured). The JSON edits
keep the real document and change only ranks / counts / missing ranks into the shape
NCCL's JSON writer gives them (rasDumpCommsToJSON, src/ras/client_support.cc; ras.rst's JSON
sample); the text edits follow the report's format strings in the same file (group row
"%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s", the DEAD and MISMATCH entries)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nccl_ras"
REAL_JSON = (FIXTURES / "ras-2.28.9-status.json").read_bytes()
REAL_TEXT = (FIXTURES / "ras-2.28.9-status.txt").read_bytes()
REAL_HASH = "0x4a93e93235c76d08"
PEER_PID = 669  # the second rank's pid: invented, one above the real job's 668


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(REAL_JSON)
    doc["communicators"] = doc["communicators"][:1]  # the world communicator, pid 668
    doc["communicators_count"] = 1
    return doc


def _peer(rank0: dict[str, Any]) -> dict[str, Any]:
    peer = copy.deepcopy(rank0)
    peer.update(rank=1, pid=PEER_PID, cuda_dev=1, nvml_dev=1)
    return peer


def two_rank_json(all_reduce: tuple[int, int], *, peer_abort: bool = False) -> bytes:
    """The world communicator with two ranks that launched ``all_reduce`` AllReduces each
    (the other ops agree at 3); ``peer_abort`` sets the second rank's abort_flag."""
    doc = _doc()
    comm = doc["communicators"][0]
    rank0 = comm["ranks"][0]
    peer = _peer(rank0)
    for r, n in ((rank0, all_reduce[0]), (peer, all_reduce[1])):
        r["collective_counts"] = {op: 3 for op in r["collective_counts"]}
        r["collective_counts"]["AllReduce"] = n
    peer["status"]["abort_flag"] = peer_abort
    comm.update(size=2, ranks_count=2, missing_ranks_count=0, ranks=[rank0, peer])
    return json.dumps(doc, indent=2).encode()


def dead_peer_json(*, considered_dead: bool = True) -> bytes:
    """The world communicator of two ranks whose second rank did not answer: RAS lists it
    under missing_ranks with unresponsive (and, after 60 s, considered_dead) set."""
    doc = _doc()
    comm = doc["communicators"][0]
    rank0 = comm["ranks"][0]
    missing = {k: v for k, v in _peer(rank0).items() if k not in ("status", "collective_counts")}
    missing["status"] = {"unresponsive": True, "considered_dead": considered_dead}
    comm.update(size=2, ranks_count=1, missing_ranks_count=1, missing_ranks=[missing])
    return json.dumps(doc, indent=2).encode()


def _group_row(comms: int, ranks: int, errors: str) -> str:
    # NCCL's "%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s"
    return f"{0:5d}  {comms:8d}  {1:8d}  {ranks!s:>8}  {ranks:8d}  {ranks:8d}  {'RUNNING':>8}  {errors:>6}"


def _text(row: str, errors: str, warnings: str) -> bytes:
    real = REAL_TEXT.decode()
    head, _, _ = real.partition("    0         2")
    return (
        head + row + "\n\nErrors\n======\n\n" + errors + "Warnings\n========\n\n" + warnings
    ).encode()


def mismatch_text() -> bytes:
    """NCCL 2.26+'s text report of a count mismatch on the world communicator."""
    warnings = (
        f"#0-0 ({REAL_HASH[2:]}) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  1 rank has launched up to operation 7\n"
        "  1 rank has launched up to operation 6\n"
        f"  Rank 1 -- GPU 1 managed by process {PEER_PID} on node 192.0.2.2\n\n"
    )
    return _text(_group_row(1, 2, "MISMATCH"), "", warnings)


def dead_text() -> bytes:
    """The text report once RAS has declared the second process dead (ras.rst's example,
    the format strings of client_support.cc)."""
    errors = (
        "DEAD\n"
        "  1 job process is considered dead (unreachable via the RAS network)\n"
        f"  Process {PEER_PID} on node 192.0.2.2 managing GPU 1\n\n"
        f"#0-0 ({REAL_HASH[2:]}) INCOMPLETE\n"
        "  Missing communicator data from 1 rank\n"
        "  The missing rank: 1\n\n"
    )
    return _text(_group_row(1, 2, "INCOMPLETE"), errors, "")
