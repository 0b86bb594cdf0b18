"""Faults inside a rank: an arena reporting impossible byte counts, run through the real
probe in a real process; the mark is kept, the bad field is null with a why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rankscope.record import Mark
from rankscope.record.reader import read_flight

RANK = textwrap.dedent(
    """
    from rankscope.rank import probe

    class Arena:
        reserved_bytes = float("inf")
        backed_bytes = float("nan")
        def retained_bytes(self):
            return -5

    kv = Arena()
    probe.configure(tp_rank=0, pp_rank=0, runner="target")
    probe.arenas.register("kv", kv)
    probe.mark("kv_pool_sized")
    print("done", flush=True)
    """
)


def test_an_arena_reporting_inf_keeps_its_mark_with_the_field_null(flight_dir: Path) -> None:
    env = dict(os.environ, RANKSCOPE_DIR=str(flight_dir), RANKSCOPE_BOOT_ID="boot-inf")
    out = subprocess.run(
        [sys.executable, "-c", RANK], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout == "done\n", out.stderr  # the host is untouched
    marks = [r.body for r in read_flight(flight_dir).records if isinstance(r.body, Mark)]
    assert [m.phase for m in marks] == ["kv_pool_sized"]
    kv = marks[0].arenas["kv"]
    assert kv.reserved is None and kv.backed is None and kv.retained is None
    assert kv.why and "inf" in kv.why and "nan" in kv.why and "negative" in kv.why
