"""The host daemon, `rankscope serve`: reads the flight directory, samples the cards, and
publishes everything from the one metric catalog over HTTP (Prometheus, JSON API, status
page) and, when asked, OTLP."""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any


def _prometheus_client_by_parts() -> None:
    """Register prometheus_client without running its ``__init__``, which imports the whole
    library: its push-gateway client and HTTP servers load http.server, urllib.request,
    wsgiref and ssl (OpenSSL), about 6 MiB resident the daemon never uses. Importing a part
    (prometheus_client.registry) loads that part and what it imports; the first name asked of
    the package itself (``from prometheus_client import Counter``) runs the ``__init__`` then,
    so any other user in the process sees the whole package."""
    if "prometheus_client" in sys.modules:
        return
    spec = importlib.util.find_spec("prometheus_client")
    if spec is None or spec.loader is None:
        return  # not installed: the import that needs it says so
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    lock = threading.Lock()

    def complete(name: str) -> Any:
        with lock:
            if package.__dict__.get("__getattr__") is complete:
                del package.__dict__["__getattr__"]
                loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules["prometheus_client"] = package


_prometheus_client_by_parts()
