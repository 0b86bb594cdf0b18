"""Real Prometheus and Alertmanager (Debian's packages) on loopback, for the tests.

Each runs from its own temporary directory, on free ports, and is stopped by the context
manager. Debian names the Alertmanager binary prometheus-alertmanager.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankscope.demo.services import free_port, start, stop, wait_ready


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"none of {names} is installed; scripts/test.sh installs them from Debian")


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            http_get(url, timeout=2.0)
            return
        except Exception as exc:
            last = exc
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        body = json.loads(http_get(f"{self.url}/api/v1/query?{q}"))
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        body = json.loads(http_get(f"{self.url}/api/v1/alerts"))
        return list(body["data"]["alerts"])

    def targets_up(self) -> bool:
        body = json.loads(http_get(f"{self.url}/api/v1/targets"))
        active = body["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


@contextlib.contextmanager
def prometheus(
    workdir: Path,
    *,
    scrape_targets: list[str],
    rule_files: list[Path] = (),  # type: ignore[assignment]
    alertmanager_url: str | None = None,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    extra_scrape_configs: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> Iterator[Prometheus]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": "rankscope", "static_configs": [{"targets": scrape_targets}]},
            *extra_scrape_configs,
        ],
    }
    if alertmanager_url:
        host = urllib.parse.urlparse(alertmanager_url).netloc
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [host]}]}]}
    cfg = workdir / "prometheus.yml"
    cfg.write_text(json.dumps(config))  # JSON is YAML
    log = workdir / "prometheus.log"
    proc = start(
        [
            binary("prometheus"),
            f"--config.file={cfg}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/-/ready", proc, log)
        yield Prometheus(url=url, proc=proc, log=log)
    finally:
        stop(proc, grace=10)


@dataclass
class Alertmanager:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alerts(self) -> list[dict[str, Any]]:
        return list(json.loads(http_get(f"{self.url}/api/v2/alerts")))


@contextlib.contextmanager
def alertmanager(workdir: Path, config_text: str) -> Iterator[Alertmanager]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cluster_port = free_port()
    cfg = workdir / "alertmanager.yml"
    cfg.write_text(config_text)
    log = workdir / "alertmanager.log"
    proc = start(
        [
            binary("prometheus-alertmanager", "alertmanager"),
            f"--config.file={cfg}",
            f"--storage.path={workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--cluster.listen-address=127.0.0.1:{cluster_port}",
        ],
        log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/-/ready", proc, log)
        yield Alertmanager(url=url, proc=proc, log=log)
    finally:
        stop(proc, grace=10)
