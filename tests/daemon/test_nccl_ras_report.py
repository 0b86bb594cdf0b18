"""The NCCL RAS report parser (rankscope.daemon.nccl_ras_report) on the real reports NCCL
2.28.9 sent on the GPU machine (tests/fixtures/nccl_ras, byte-for-byte), on two-GPU shapes
edited from them (tests/nccl_ras_shapes.py), and on broken variants."""

from __future__ import annotations

import pytest

import nccl_ras_shapes as shapes
from rankscope.daemon.nccl_ras_report import (
    ReportError,
    count_mismatches,
    parse_report,
    status_differs,
)

FIX = shapes.FIXTURES
OPS = ["AllGather", "AllReduce", "Broadcast", "Reduce", "ReduceScatter"]


def test_the_real_json_report_gives_both_communicators_of_the_job_with_every_rank() -> None:
    report = parse_report((FIX / "ras-2.28.9-status.json").read_bytes())
    assert (report.format, report.nccl_version) == ("json", "2.28.9")
    assert (report.cuda_runtime_version, report.cuda_driver_version) == (13000, 13000)
    assert [c.key for c in report.communicators] == [
        ("0x4a93e93235c76d08", "0xf0f5947519ffabd8:0x40802503e7d6e292"),
        ("0x9181d9fd5d9f6329", "0x37e3854041d7a1f9:0x876e15cf0faed8b3"),
    ]
    for comm in report.communicators:
        assert (comm.size, comm.ranks_count, comm.missing_ranks_count) == (1, 1, 0)
        (rank,) = comm.ranks
        assert (rank.rank, rank.host, rank.pid, rank.cuda_dev) == (0, "192.0.2.2", 668, 0)
        # One-rank communicators: NCCL's taskAppend short-cuts nRanks == 1 to a local copy
        # before anything is counted, so the real job's all_reduce etc. show as 0.
        assert rank.counts == dict.fromkeys(OPS, 0)
        assert count_mismatches(comm) == {} and not status_differs(comm)


def test_a_second_job_on_its_own_address_reports_only_its_own_communicator() -> None:
    report = parse_report((FIX / "ras-2.28.9-jobC-status.json").read_bytes())
    assert [r.pid for c in report.communicators for r in c.ranks] == [701]


def test_the_real_text_reports_give_the_grouped_communicators() -> None:
    job_a = parse_report((FIX / "ras-2.28.9-status.txt").read_bytes())
    assert job_a.format == "text" and job_a.nccl_version == "2.28.9"
    assert [(c.hash, c.size) for c in job_a.communicators] == [("#0-0", 1), ("#0-1", 1)]
    assert job_a.dead_count == 0
    verbose = parse_report((FIX / "ras-2.28.9-verbose.txt").read_bytes())
    assert len(verbose.communicators) == 2
    # The default port shared by two jobs (SO_REUSEPORT): this connection reached job B.
    job_b = parse_report((FIX / "ras-2.28.9-twojobs1-status.txt").read_bytes())
    assert len(job_b.communicators) == 1


def test_a_two_rank_count_mismatch_is_found_in_one_report() -> None:
    """Shape edited from the real one-GPU JSON (two ranks need two GPUs): rank 1 launched
    one AllReduce fewer."""
    (comm,) = parse_report(shapes.two_rank_json((7, 6))).communicators
    assert count_mismatches(comm) == {"AllReduce": (6, 7)}
    (agree,) = parse_report(shapes.two_rank_json((7, 7))).communicators
    assert count_mismatches(agree) == {}


def test_ranks_of_different_status_differ() -> None:
    """Shape edited from the real one-GPU JSON: the second rank's abort_flag is set."""
    (comm,) = parse_report(shapes.two_rank_json((7, 7), peer_abort=True)).communicators
    assert status_differs(comm)
    (same,) = parse_report(shapes.two_rank_json((7, 7))).communicators
    assert not status_differs(same)


def test_a_dead_peer_in_json_is_a_missing_rank_considered_dead() -> None:
    """Shape edited from the real one-GPU JSON into NCCL's missing_ranks layout."""
    (comm,) = parse_report(shapes.dead_peer_json()).communicators
    assert (comm.size, comm.ranks_count, comm.missing_ranks_count) == (2, 1, 1)
    (missing,) = comm.missing
    assert (missing.rank, missing.pid, missing.unresponsive, missing.considered_dead) == (
        1,
        shapes.PEER_PID,
        True,
        True,
    )


def test_the_text_reports_dead_section_and_mismatch_entries() -> None:
    """Text built from NCCL's format strings around the real report's head."""
    dead = parse_report(shapes.dead_text())
    assert dead.dead_count == 1
    # The INCOMPLETE entry names the hash of group 0's first communicator.
    assert [c.hash for c in dead.communicators] == [shapes.REAL_HASH]
    (comm,) = parse_report(shapes.mismatch_text()).communicators
    assert (comm.hash, comm.size, comm.reported_mismatches) == (shapes.REAL_HASH, 2, ("AllReduce",))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(
            (FIX / "ras-2.28.9-status.json").read_bytes()[:700], "truncated", id="json-cut"
        ),
        pytest.param(
            (FIX / "ras-2.28.9-status.txt").read_bytes()[:300], "truncated", id="text-cut"
        ),
        pytest.param(b"", "truncated", id="empty"),
        pytest.param(
            (FIX / "ras-2.28.9-status.json").read_bytes().replace(b'"pid": 668', b'"pid": "x"'),
            "malformed",
            id="json-pid-string",
        ),
        *(
            pytest.param(
                (FIX / "ras-2.28.9-status.json").read_bytes().replace(before, after, 1),
                "malformed",
                id=f"json-{name}",
            )
            for name, before, after in [
                ("size-null", b'"size": 1', b'"size": null'),
                ("ranks-count-null", b'"ranks_count": 1', b'"ranks_count": null'),
                ("missing-count-null", b'"missing_ranks_count": 0', b'"missing_ranks_count": null'),
                ("status-pairs", b'"status": {\n', b'"status": [["init_state", 0]], "x": {\n'),
                ("internal-name", b'"collective_counts"', b'"counts"'),
            ]
        ),
        pytest.param(b"{ nonsense ] }\n", "malformed", id="json-garbage"),
        pytest.param(b"\xff\xfe garbage", "malformed", id="not-utf8"),
        pytest.param(b"HTTP/1.1 400 Bad Request\r\n\r\n", "malformed", id="not-ras"),
        pytest.param(
            (FIX / "ras-2.28.9-status.json").read_bytes().replace(b'"2.28.9"', b'"three"'),
            "unknown_version",
            id="json-version",
        ),
        pytest.param(
            (FIX / "ras-2.28.9-status.txt").read_bytes().replace(b"2.28.9", b"next", 1),
            "unknown_version",
            id="text-version",
        ),
    ],
)
def test_a_broken_report_raises_its_bounded_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ReportError) as err:
        parse_report(data)
    assert err.value.reason == reason
