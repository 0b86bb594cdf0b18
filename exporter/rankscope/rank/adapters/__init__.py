"""Framework adapters (SGLang, vLLM) that attach themselves as the framework's modules are
imported (rankscope.rank.imports); rankscope never imports a framework itself.
docs/integrations.md says what each does."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from rankscope.rank.adapters import sglang, vllm
from rankscope.rank.adapters.points import Adapter
from rankscope.rank.imports import FINDER, PostImportFinder

__all__ = ["ADAPTERS", "PostImportFinder", "install_import_hooks", "uninstall_import_hooks"]

log = logging.getLogger("rankscope.adapters")

ADAPTERS: tuple[Adapter, ...] = (sglang.ADAPTER, vllm.ADAPTER)

_installed: list[Adapter] = []


def install_import_hooks(adapters: Sequence[Adapter] = ADAPTERS) -> bool:
    """Watch the adapters' modules (idempotent). Returns True when watching; never raises."""
    try:
        for adapter in adapters:
            if adapter not in _installed:
                _installed.append(adapter)
            for name in adapter.modules():
                FINDER.add(name, adapter.on_import)
            # Modules imported before the hooks were installed (an import-time arming that
            # came late): attach now, in the order the adapter lists them.
            for name in adapter.modules():
                if name in sys.modules:
                    adapter.on_import(sys.modules[name])
        return True
    except Exception as exc:
        log.warning("rankscope adapters: import hooks not installed: %r", exc)
        return False


def uninstall_import_hooks() -> None:
    """Stop watching (tests); hooks already attached stay attached."""
    while _installed:
        adapter = _installed.pop()
        for name in adapter.modules():
            FINDER.remove(name, adapter.on_import)
