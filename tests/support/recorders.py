"""A Recorder for a rank of a three-rank boot, as the census tests write it: a process identity
made up for the test unless the caller names a real one."""

from __future__ import annotations

from pathlib import Path

from rankscope.rank.writer import ProcessIdentity, RankIdentity, Recorder


def rank_recorder(
    flight_dir: Path,
    rank: int,
    *,
    boot: str = "b1",
    host: str = "h",
    pid: int = 0,
    ticks: int = 7,
    nspid: tuple[int, ...] | None = None,
    pidns: int | None = None,
) -> Recorder:
    """``pid`` 0: a made-up pid, 1000 + rank."""
    process = ProcessIdentity(
        host=host, pid=pid or 1000 + rank, start_ticks=ticks, nspid=nspid, pidns=pidns
    )
    return Recorder(
        flight_dir=flight_dir,
        boot=boot,
        process=process,
        rank=RankIdentity(rank=rank, world_size=3),
    )
