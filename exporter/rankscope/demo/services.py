"""The demo's peers on loopback, each stopped by its context manager: the daemon, a real
Prometheus, a real Alertmanager, and the webhook receiver the pages arrive at."""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml


class ServiceError(RuntimeError):
    """A peer did not start; the message says which, and where its log is."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether the daemon could listen on ``port``, binding with SO_REUSEADDR as it does: free
    when only a demo that just ended holds it (in TIME-WAIT), taken while a process listens."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:
    """In the child: SIGTERM when the demo dies (Linux PR_SET_PDEATHSIG; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A peer in its own session (a Ctrl-C reaches the demo, which stops the peers in order)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def stop(proc: subprocess.Popen[Any], grace: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(
    url: str, proc: subprocess.Popen[bytes] | None, log: Path | None = None, timeout: float = 60.0
) -> None:
    """Until ``url`` answers; ServiceError when ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            name = Path(str(proc.args[0] if isinstance(proc.args, list) else proc.args)).name
            seen = ""
            if log is not None:
                tail = log.read_text(errors="replace").splitlines()[-15:]
                seen = f"; see {log}:\n" + "\n".join(tail)
            raise ServiceError(f"{name} exited with {proc.returncode}{seen}")
        try:
            with urllib.request.urlopen(url, timeout=2.0):
                return
        except Exception as exc:
            last = exc
            time.sleep(0.1)
    seen = f"; see {log}" if log is not None else ""
    raise ServiceError(f"{url} did not answer within {timeout:.0f}s ({last}){seen}")


@dataclass
class Service:
    """A peer answering HTTP on loopback; ``get`` reads its JSON API."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=3.0) as resp:
            return json.loads(resp.read())


@contextlib.contextmanager
def served(argv: list[str], log: Path, port: int, ready_path: str) -> Iterator[Service]:
    """A service ready once ``ready_path`` on ``port`` answers, stopped on the way out."""
    proc = start(argv, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + ready_path, proc, log)
        yield Service(url=url, proc=proc, log=log)
    finally:
        stop(proc, grace=10)


def daemon(
    workdir: Path, flight_dir: Path, port: int, extra_args: Sequence[str] = ()
) -> contextlib.AbstractContextManager[Service]:
    """`rankscope serve` over the demo's flight directory, the command a user runs."""
    argv = [sys.executable, "-m", "rankscope", "serve", f"--web.listen-address=127.0.0.1:{port}"]
    argv += [f"--flight-dir={flight_dir}", *extra_args]
    return served(argv, workdir / "daemon.log", port, "/api/v1/cards")


def _configured(
    name: str, binary: str, workdir: Path, config: str, *flags: str
) -> contextlib.AbstractContextManager[Service]:
    """``binary`` with its config file and log in ``workdir``, on a free loopback port."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = workdir / f"{name}.yml"
    cfg.write_text(config)
    argv = [binary, f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{port}", *flags]
    return served(argv, workdir / f"{name}.log", port, "/-/ready")


def prometheus(
    binary: str,
    workdir: Path,
    *,
    scrape_targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    alertmanager_url: str | None = None,
    scrape_interval: str = "1s",
    extra_scrape_configs: Sequence[dict[str, Any]] = (),
) -> contextlib.AbstractContextManager[Service]:
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        # job="rankscope" is what the mixin's default selector matches.
        "scrape_configs": [
            {"job_name": "rankscope", "static_configs": [{"targets": list(scrape_targets)}]},
            *extra_scrape_configs,
        ],
    }
    if alertmanager_url:
        am_host = urllib.parse.urlparse(alertmanager_url).netloc
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [am_host]}]}]}
    text = yaml.safe_dump(config, sort_keys=False)
    return _configured(
        "prometheus", binary, workdir, text, f"--storage.tsdb.path={workdir / 'data'}"
    )


def alertmanager(
    binary: str, workdir: Path, config_text: str
) -> contextlib.AbstractContextManager[Service]:
    storage = f"--storage.path={workdir / 'am-data'}"
    cluster = f"--cluster.listen-address=127.0.0.1:{free_port()}"
    return _configured("alertmanager", binary, workdir, config_text, storage, cluster)


@dataclass
class Page:
    """One alert of one webhook notification, as Alertmanager delivered it."""

    receiver: str
    status: str  # firing | resolved
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    fingerprint: str

    @classmethod
    def from_notification(cls, body: dict[str, Any]) -> list[Page]:
        def strings(obj: Any) -> dict[str, str]:
            return {str(k): str(v) for k, v in (obj or {}).items()}

        return [
            cls(
                receiver=str(body.get("receiver", "")),
                status=str(alert.get("status", body.get("status", ""))),
                alertname=strings(alert.get("labels")).get("alertname", "?"),
                labels=strings(alert.get("labels")),
                annotations=strings(alert.get("annotations")),
                starts_at=str(alert.get("startsAt", "")),
                fingerprint=str(alert.get("fingerprint", "")),
            )
            for alert in body.get("alerts", [])
        ]


class WebhookReceiver(ThreadingHTTPServer):
    """Collects Alertmanager's webhook notifications (a stand-in for PagerDuty or Slack),
    serving them from its own thread while entered."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Hook)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/hook"
        self.pages: list[Page] = []  # extended whole by the handler threads, read by the demo
        self.thread = threading.Thread(target=self.serve_forever, name="webhook", daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.thread.join()
        self.server_close()


class _Hook(BaseHTTPRequestHandler):
    server: WebhookReceiver

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            self.server.pages.extend(Page.from_notification(json.loads(raw)))
        except (ValueError, AttributeError, TypeError):
            self.send_response(400)
        else:
            self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the demo prints the pages itself
