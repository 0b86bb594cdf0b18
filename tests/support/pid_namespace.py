"""A real process in a PID namespace of its own (unshare), as a containerised rank runs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def in_pid_namespace(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`python -c code args` as the first process of a new PID namespace, its stdout piped;
    killed with its namespace on leaving. Skips where unshare(1) or root is missing."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare(1) and root for a PID namespace")
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
         sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc
    finally:
        proc.send_signal(signal.SIGKILL)  # --kill-child takes the namespace down with it
        proc.wait(timeout=10)
