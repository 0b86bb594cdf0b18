"""`rankscope serve` as a real subprocess for the fault suite, and the checks every fault
test makes: the daemon still serves, promtool accepts /metrics, and what the records held
before the fault is still what the daemon publishes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from support.services import binary, free_port


@dataclass
class Daemon:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def metrics(self) -> str:
        """One scrape, which must answer within a Prometheus scrape timeout and pass promtool."""
        status, body = self.get("/metrics", timeout=10.0)
        assert status == 200, body[:500]
        text = body.decode()
        check = subprocess.run(
            [binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
        )
        # promtool's lint notes (counter naming) exit 3; a parse error exits 1.
        assert check.returncode in (0, 3) and "error" not in check.stderr.lower(), check.stderr
        return text

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [
            (dict(s.labels), s.value)
            for fam in text_string_to_metric_families(self.metrics())
            for s in fam.samples
            if s.name == name
        ]


@contextlib.contextmanager
def daemon(
    flight_dir: Path,
    tmp_path: Path,
    *args: str,
    port: int | None = None,
    wrap: tuple[str, ...] = (),
) -> Iterator[Daemon]:
    """``wrap`` prefixes the command (e.g. setpriv, to run without some capabilities)."""
    port = port or free_port()
    log = tmp_path / "serve.log"
    cmd = [
        *wrap,
        sys.executable,
        "-m",
        "rankscope",
        "serve",
        f"--flight.dir={flight_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--no-collector.cards",
        "--no-collector.holdings",
        *args,
    ]  # fmt: skip  (a later --web.listen-address or --collector.cards wins)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    d = Daemon(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield d
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError("SIGTERM did not stop the daemon") from None


# A real rank process: marks phase_000.. through the probe, each taking 1 MiB more.
RANK = textwrap.dedent(
    """
    import sys
    from rankscope.rank import probe
    probe.configure(tp_rank=0, pp_rank=0, runner="target")
    for i in range(int(sys.argv[1])):
        probe.mark(f"phase_{i:03d}", seq=i)
    """
)


def run_rank(flight_dir: Path, boot: str, marks: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env.update(RANKSCOPE_DIR=str(flight_dir), RANKSCOPE_BOOT_ID=boot)
    subprocess.run([sys.executable, "-c", RANK, str(marks)], env=env, check=True, timeout=120)


def phase_stamps(d: Daemon, boot: str) -> list[str]:
    """The phases /metrics publishes for ``boot`` (one timestamp series per mark)."""
    return sorted(
        labels["phase"]
        for labels, _ in d.samples("rankscope_phase_timestamp_seconds")
        if labels.get("boot") == boot
    )
