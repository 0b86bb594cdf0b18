"""A long-lived node's flight directory: `rankscope serve` over 20,000 and 100,000 small
files (many restarts of this host's processes, long exited), against the code before the
refresh read only what changed, in the same run.

    python3 bench/bench_flightdir.py --base DIR [--files 20000 100000] [--scrapes 30]

DIR holds the baseline's source tree (its exporter/), e.g.
`mkdir DIR && git archive 398695f exporter | tar -x -C DIR`. For each size and each code,
a real daemon subprocess reads the directory, then: its CPU over --idle seconds with
nothing changing and no scrape (fraction of one core, from /proc/PID/stat; --idle 305
takes in one of the full stat passes the daemon makes every five minutes), and --scrapes
GET /metrics over loopback one after another (p50, p99). Both daemons read with a budget
large enough to catch up in one refresh, so start-up is not what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from rankscope.procfs import HOST_PIDNS_INODE

REPO = Path(__file__).resolve().parent.parent
PROCESSES_PER_BOOT = 8
TICKS = os.sysconf("SC_CLK_TCK")


def write_directory(flight_dir: Path, files: int) -> None:
    """``files`` marks files of 3 lines, 8 processes a boot, written by pids of this host
    that exited long ago (their start time matches no running process)."""
    flight_dir.mkdir()
    host = socket.gethostname()
    wall = time.time() - 3 * 86400.0  # a second apart: even 100,000 files end a day ago
    for n in range(files):
        boot, pid = f"boot-{n // PROCESSES_PER_BOOT:06d}", 100_000 + n
        header = {"v": 1, "kind": "mark", "boot": boot, "rank": n % PROCESSES_PER_BOOT,
                  "host": host, "pid": pid, "start_ticks": 1, "pidns": HOST_PIDNS_INODE}  # fmt: skip
        lines = (
            json.dumps({**header, "mono": float(i), "wall": wall + n + i, "phase": phase}) + "\n"
            for i, phase in enumerate(("pre_weight_load", "weights_loaded", "boot_complete"))
        )
        (flight_dir / f"marks-{host}-{pid}-1.jsonl").write_text("".join(lines))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 120.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(code: Path, flight_dir: Path, idle: float, scrapes: int) -> dict[str, float]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code / "exporter"), "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable, "-m", "rankscope", "serve", f"--flight.dir={flight_dir}",
        f"--web.listen-address=127.0.0.1:{port}", "--no-collector.cards",
        "--no-collector.holdings", "--flight.read-budget=1GiB",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if get(url + "/readyz") == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{code}: the daemon never became ready")
            time.sleep(0.5)
        get(url + "/metrics")  # the first scrape builds what later ones reuse
        time.sleep(2.0)
        before = cpu_seconds(proc.pid)
        time.sleep(idle)
        idle_core = (cpu_seconds(proc.pid) - before) / idle
        took = []
        for _ in range(scrapes):
            start = time.perf_counter()
            assert get(url + "/metrics") == 200
            took.append(time.perf_counter() - start)
        return {
            "idle_core": idle_core,
            "scrape_p50_s": percentile(took, 0.5),
            "scrape_p99_s": percentile(took, 0.99),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline's source tree")
    parser.add_argument("--files", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle measured")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    opts = parser.parse_args()
    results = []
    for files in opts.files:
        with tempfile.TemporaryDirectory() as tmp:
            flight_dir = Path(tmp) / "flight"
            write_directory(flight_dir, files)
            ours = measure(REPO, flight_dir, opts.idle, opts.scrapes)
            base = measure(opts.base, flight_dir, opts.idle, opts.scrapes)
        results.append({"files": files, "rankscope": ours, "baseline": base})
        print(
            f"{files:>7} files | scrape p50 {ours['scrape_p50_s'] * 1e3:8.1f} ms "
            f"p99 {ours['scrape_p99_s'] * 1e3:8.1f} ms, idle {ours['idle_core']:6.2%} of a core"
            f" | baseline p50 {base['scrape_p50_s'] * 1e3:8.1f} ms "
            f"p99 {base['scrape_p99_s'] * 1e3:8.1f} ms, idle {base['idle_core']:6.2%}"
            f" | ratio p50 {ours['scrape_p50_s'] / base['scrape_p50_s']:.3f}x "
            f"p99 {ours['scrape_p99_s'] / base['scrape_p99_s']:.3f}x "
            f"idle {ours['idle_core'] / max(base['idle_core'], 1e-9):.3f}x",
            flush=True,
        )
    if opts.out:
        opts.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
