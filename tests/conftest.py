"""Shared test set-up: the gpu marker, temporary files, flight directories, and isolated probe
state."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


def _gpu_available() -> str | None:
    """None when a CUDA GPU and NVML answer here, else why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() < 1:
                return "NVML sees no GPU"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        return f"no NVML: {exc}"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    # torch.cuda.is_available() reads the device count through NVML first and so creates no
    # CUDA context in the pytest process.
    if not torch.cuda.is_available():
        return "torch has no CUDA"
    return None


_GPU_SKIP = _gpu_available()
_RUN_TEMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Every temporary file of the run, pytest's own and those of the processes it starts, goes
    in one directory removed at the end. Left in /tmp, torch.compile's inductor alone added a
    precompiled header of about 150 MB a run (its key holds the venv's path, new in each fresh
    clone) until the disk filled. Set before collection: importing a test module can fix
    inductor's directories."""
    # A short name: sockets made under it (multiprocessing's) must stay within AF_UNIX's 108 bytes.
    where = tempfile.mkdtemp(prefix="rs-")
    config.stash[_RUN_TEMP] = where
    os.environ["TMPDIR"] = tempfile.tempdir = where


def pytest_unconfigure(config: pytest.Config) -> None:
    where = config.stash.get(_RUN_TEMP, None)
    if where is not None:
        shutil.rmtree(where, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _GPU_SKIP is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {_GPU_SKIP}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def flight_dir(tmp_path):
    d = tmp_path / "flight"
    d.mkdir()
    return d


@pytest.fixture
def serve_app():
    """Serves a daemon app (rankscope.daemon.app.create_app) as the daemon does (uvicorn,
    rankscope.daemon.server.serving) on a free loopback port, and returns an httpx client
    for it; stopped after the test. Call it once per app."""
    import contextlib

    import httpx

    from rankscope.daemon.server import serving

    with contextlib.ExitStack() as stack:

        def start(app):
            server = stack.enter_context(serving(app))
            return stack.enter_context(httpx.Client(base_url=server.url, timeout=10))

        yield start
