"""Real Prometheus and Alertmanager (Debian's packages) on loopback, for the tests: the
launchers are the demo's (rankscope.demo.services); this only finds the binaries, failing
the test when one is missing. Debian names the Alertmanager binary prometheus-alertmanager.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rankscope.demo import services
from rankscope.demo.services import free_port, start, stop, wait_ready

__all__ = [
    "Alertmanager",
    "Prometheus",
    "alertmanager",
    "binary",
    "free_port",
    "http_get",
    "prometheus",
    "start",
    "stop",
    "wait_http",
]


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
    wait_ready(url, proc, None, timeout)


class Prometheus(services.Service):
    """The demo's Prometheus handle, with the reads only the tests make."""

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/alerts")["data"]["alerts"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector; AssertionError when Prometheus refuses it."""
        q = urllib.parse.urlencode({"query": expr})
        body = self.get(f"/api/v1/query?{q}")
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def targets_up(self) -> bool:
        active = self.get("/api/v1/targets")["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


@contextlib.contextmanager
def prometheus(workdir: Path, **options: Any) -> Iterator[Prometheus]:
    with services.prometheus(binary("prometheus"), workdir, **options) as prom:
        yield Prometheus(prom.url, prom.proc, prom.log)


class Alertmanager(services.Service):
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v2/alerts"))


@contextlib.contextmanager
def alertmanager(workdir: Path, config_text: str) -> Iterator[Alertmanager]:
    am_binary = binary("prometheus-alertmanager", "alertmanager")
    with services.alertmanager(am_binary, workdir, config_text) as am:
        yield Alertmanager(am.url, am.proc, am.log)
