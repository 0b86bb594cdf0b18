"""Running code right after a module is imported, without importing it: the arming waits for
torch, the OOM observer for torch.cuda, the adapters for their frameworks' modules. The one
meta-path finder finds nothing itself: it wraps the loader the other finders return, so the
callbacks run once the module's body has. It leaves sys.meta_path with the last name."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("rankscope")

Callback = Callable[[ModuleType], None]


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # required of a loader with exec_module

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        for callback in self._finder.remove(module.__name__):
            try:
                callback(module)
            except Exception as exc:  # never break the program's import
                log.warning("rankscope: after importing %s: %r", module.__name__, exc)

    def __getattr__(self, name: str) -> Any:  # resource readers and the like
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.watch: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.watch:
            return None
        try:
            finders = (f for f in sys.meta_path if f is not self and hasattr(f, "find_spec"))
            spec = next(filter(None, (f.find_spec(fullname, path, target) for f in finders)), None)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None  # not found, a namespace package or a legacy loader: leave it alone
            spec.loader = _NotifyingLoader(spec.loader, self)
            return spec
        except Exception as exc:  # never break the program's import
            log.warning("rankscope: watching %s failed: %r", fullname, exc)
            return None

    def add(self, name: str, callback: Callback) -> None:
        with self._lock:
            callbacks = self.watch.setdefault(name, [])
            if callback not in callbacks:
                callbacks.append(callback)
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def remove(self, name: str, callback: Callback | None = None) -> list[Callback]:
        """Stop calling ``callback`` (None: any) after module ``name``; what was removed."""
        with self._lock:
            callbacks = self.watch.pop(name, [])
            if callback is not None:
                if kept := [c for c in callbacks if c != callback]:
                    self.watch[name] = kept
                callbacks = [c for c in callbacks if c == callback]
            if not self.watch and self in sys.meta_path:
                sys.meta_path.remove(self)
        return callbacks


FINDER = PostImportFinder()
# Call ``callback(module)`` once after module ``name`` is imported (a failure is logged); a
# module imported already is the caller's to handle.
after_import = FINDER.add
