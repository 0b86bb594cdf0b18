"""The README's "Instrument your own server" snippet, unchanged, under real gloo with two
processes, 20 times: every process exits 0.

Before the fix the comparison thread and its gloo group were still alive when the
interpreter tore torch down, and each run died with SIGABRT ("terminate called without an
active exception"): exit status -6 in 3 runs of 3 here. The snippet is taken from README.md,
so the test follows the README; only the names it leaves to the reader are defined.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.services import free_port

ROOT = Path(__file__).resolve().parents[1]
RUNS = 20

# What the snippet leaves to the reader, defined as plainly as possible. 100 iterations: the
# census's second snapshot round (every 50 ticks) is handed to the comparison thread at the
# very end, the moment the race with the interpreter's teardown was lost.
PREAMBLE = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
tp_rank, pp_rank = dist.get_rank(), 0


class KVPool:
    reserved_bytes = backed_bytes = 1 << 20
    retained_bytes = 0


kv_pool = KVPool()
scheduler = range(100)


def load_weights():
    pass


def step(batch):
    dist.all_reduce(torch.ones(4))


"""


def readme_snippet() -> str:
    """The python block of the README's "Instrument your own server" section that enables
    the comparison."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Instrument your own server", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    (snippet,) = [b for b in blocks if "census.enable_comparison()" in b]
    return snippet


def test_readme_snippet_exits_zero_every_time(tmp_path: Path) -> None:
    program = tmp_path / "serve.py"
    program.write_text(PREAMBLE + readme_snippet())
    flight = tmp_path / "flight"
    failures = []
    for run in range(RUNS):
        port = str(free_port())
        procs = [
            subprocess.Popen(
                [sys.executable, str(program)],
                env={
                    "PATH": "/usr/bin:/bin",
                    "PYTHONPATH": str(ROOT / "exporter"),
                    "RANK": str(rank),
                    "WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                    "RANKSCOPE_DIR": str(flight),
                    "OMP_NUM_THREADS": "1",
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(2)
        ]
        for rank, proc in enumerate(procs):
            _, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                failures.append((run, rank, proc.returncode, err[-500:]))
    assert failures == [], failures
    # The snippet really ran its comparison: both ranks recorded snapshots at rounds 50, 100.
    from rankscope.record import Census, of_kind
    from rankscope.record.reader import read_flight

    rounds = sorted(
        (line.header.rank, line.body.round)
        for line in of_kind(read_flight(flight, all_boots=True).records, Census)
    )
    assert rounds == sorted([(0, 50), (0, 100), (1, 50), (1, 100)] * RUNS)
