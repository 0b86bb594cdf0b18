"""prometheus_client by parts, for `rankscope serve` only: importing this module registers the
package without running its ``__init__`` (docs/architecture.md, "What the daemon imports").
The serve command (rankscope.daemon.cli) imports it before anything that loads a part; any
other importer of rankscope.daemon gets prometheus_client as every other user does."""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any


def load_by_parts() -> None:
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


load_by_parts()
