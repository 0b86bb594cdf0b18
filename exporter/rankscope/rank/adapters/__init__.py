"""Framework adapters (SGLang, vLLM) that attach themselves when the framework is imported.

    from rankscope.rank import adapters
    adapters.install_import_hooks()   # idempotent, never raises; `rankscope run` calls it

installs a meta-path finder that watches the modules the adapters hook. When one of them
has been imported (executed in full), the matching adapter attaches its hooks to it; until
then, and in a process that never imports the framework, nothing happens and rankscope
never imports the framework itself. A module already imported when the hooks are installed
is attached at once. docs/integrations.md says what each adapter marks and counts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from rankscope.rank.adapters import sglang, vllm
from rankscope.rank.adapters.points import Adapter

__all__ = ["ADAPTERS", "PostImportFinder", "install_import_hooks", "uninstall_import_hooks"]

log = logging.getLogger("rankscope.adapters")

ADAPTERS: tuple[Adapter, ...] = (sglang.ADAPTER, vllm.ADAPTER)

_lock = threading.Lock()


class _NotifyingLoader(importlib.abc.Loader):
    """The framework's own loader, then the adapter's callback once the module has run.
    Puts the real loader back on the module, so nothing after the import sees this one."""

    def __init__(self, loader: Any, notify: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._notify = notify

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._notify(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module name it asks the finders after it and
    wraps the loader they return, so the adapter runs after the module's body."""

    def __init__(self, watch: dict[str, Callable[[ModuleType], None]]) -> None:
        self.watch = watch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        notify = self.watch.get(fullname)
        if notify is None:
            return None
        try:
            for finder in list(sys.meta_path):
                if finder is self or isinstance(finder, PostImportFinder):
                    continue
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None  # a namespace package or a legacy loader: leave it alone
            spec.loader = _NotifyingLoader(spec.loader, notify)
            return spec
        except Exception as exc:  # never break the framework's import
            log.warning("rankscope adapters: watching %s failed: %r", fullname, exc)
            return None


_finder: PostImportFinder | None = None


def _notifier(adapter: Adapter) -> Callable[[ModuleType], None]:
    return adapter.on_import


def install_import_hooks(adapters: Sequence[Adapter] = ADAPTERS) -> bool:
    """Watch the adapters' modules (idempotent). Returns True when the finder is installed;
    never raises."""
    global _finder
    try:
        with _lock:
            if _finder is None or _finder not in sys.meta_path:
                watch = {m: _notifier(a) for a in adapters for m in a.modules()}
                _finder = PostImportFinder(watch)
                sys.meta_path.insert(0, _finder)
            watched = dict(_finder.watch)
        # Modules imported before the hooks were installed (an import-time arming that came
        # late): attach now, in the order the adapter lists them.
        for name, notify in watched.items():
            module = sys.modules.get(name)
            if module is not None:
                notify(module)
        return True
    except Exception as exc:
        log.warning("rankscope adapters: import hooks not installed: %r", exc)
        return False


def uninstall_import_hooks() -> None:
    """Stop watching (tests); hooks already attached stay attached."""
    global _finder
    with _lock:
        if _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
