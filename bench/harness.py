"""What the GPU benches share: a real `rankscope serve` from this checkout, a scraper thread
hitting its /metrics, a GPU load in another process, and the daemon's published figures.

Not a bench itself; bench_interference.py, bench_sampler.py and bench_trough.py import it
(python3 bench/X.py puts bench/ first on sys.path).
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def require_cuda(what: str) -> None:
    """Exit at once, saying why, where there is no CUDA device."""
    try:
        import torch
    except ImportError:
        sys.exit(f"{what}: needs torch with CUDA (torch is not installed)")
    if not torch.cuda.is_available():
        sys.exit(f"{what}: needs a CUDA GPU; torch.cuda.is_available() is False here")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    path = str(REPO / "exporter")
    env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Daemon:
    """`python3 -m rankscope serve` from this checkout on a free loopback port, NVML source,
    holdings on; stopped by :meth:`stop`. ``extra`` are more flags (a later
    ``--device.source`` overrides the NVML one)."""

    def __init__(self, interval_ms: int, extra: Sequence[str] = (), log: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.flight_dir = tempfile.TemporaryDirectory(prefix="rankscope-bench-flight-")
        self._log = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rankscope", "serve",
             f"--web.listen-address=127.0.0.1:{self.port}",
             f"--sampler.interval={interval_ms}ms", "--device.source=nvml",
             f"--flight-dir={self.flight_dir.name}", "--log.level=warning", *extra],
            env=child_env(), stdout=self._log, stderr=self._log,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rankscope serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("rankscope serve did not become ready in 60 s")
            time.sleep(0.2)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return str(r.read().decode())

    def cards(self) -> list[dict[str, object]]:
        with urllib.request.urlopen(self.url + "/api/v1/cards", timeout=10) as r:
            cards = json.loads(r.read())["cards"]
        assert isinstance(cards, list)
        return cards

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        self.flight_dir.cleanup()


class Scraper:
    """A thread fetching ``url`` every ``every`` seconds, as Prometheus would."""

    def __init__(self, url: str, every: float = 1.0) -> None:
        self.url, self.every = url, every
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


SCRAPER = """
import sys, time, urllib.request
url, every = sys.argv[1], float(sys.argv[2])
due, last = every, time.monotonic()
while True:
    time.sleep(0.05)
    now = time.monotonic()
    # Only the time this process ran counts: held stopped (SIGSTOP) between a bench's
    # blocks, it must not make up every scrape it missed the moment it resumes.
    due -= min(now - last, 0.1)
    last = now
    if due <= 0:
        due = every
        try:
            urllib.request.urlopen(url, timeout=10).read()
        except OSError:
            pass
"""


def start_scraper(url: str, every: float = 1.0) -> subprocess.Popen[bytes]:
    """A process fetching ``url`` every ``every`` seconds of its own running time, as
    Prometheus would; in a process of its own so the bench's process stays quiet."""
    return subprocess.Popen([sys.executable, "-c", SCRAPER, url, str(every)], env=child_env())


def sampler_totals(text: str) -> tuple[float, float]:
    """(count, sum) of rankscope_sampler_duration_seconds in a text exposition."""
    count = re.search(r"^rankscope_sampler_duration_seconds_count(?:\{\})? (\S+)$", text, re.M)
    total = re.search(r"^rankscope_sampler_duration_seconds_sum(?:\{\})? (\S+)$", text, re.M)
    if not count or not total:
        raise ValueError("no rankscope_sampler_duration_seconds in the exposition")
    return float(count.group(1)), float(total.group(1))


GPU_LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
torch.cuda.synchronize(); print('loaded', flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def start_gpu_load(seconds: float) -> subprocess.Popen[str]:
    """Another process keeping the GPU busy with bf16 matmuls for ``seconds``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", GPU_LOAD, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "loaded"
    return proc


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99, p99.9 and the mean of a sample."""
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]

    return {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "mean": statistics.fmean(values)}
