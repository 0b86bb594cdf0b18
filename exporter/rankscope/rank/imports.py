"""Running code right after a module is imported, without importing it: the arming waits for
torch, the OOM observer for torch.cuda, the adapters for their frameworks' modules.

One meta-path finder serves them all. It finds nothing itself: for a watched name it asks
the finders after it and wraps the loader they return, so the callbacks run once the
module's body has; the real loader is put back on the module first. A name leaves the
watch once its module has run, and the finder leaves sys.meta_path with the last name.
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

log = logging.getLogger("rankscope")

Callback = Callable[[ModuleType], None]


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        for callback in self._finder.done(module.__name__):
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
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if finder is not self and find else None
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None  # a namespace package or a legacy loader: leave it alone
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

    def remove(self, name: str, callback: Callback) -> None:
        with self._lock:
            callbacks = self.watch.get(name, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._drop(name)

    def done(self, name: str) -> list[Callback]:
        """The callbacks of module ``name``, which has run: it leaves the watch."""
        with self._lock:
            callbacks = self.watch.get(name, [])
            self._drop(name)
        return callbacks

    def _drop(self, name: str) -> None:
        self.watch.pop(name, None)
        if not self.watch and self in sys.meta_path:
            sys.meta_path.remove(self)


FINDER = PostImportFinder()


def after_import(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once module ``name`` has been imported (each callback once;
    a failure costs a log line). A module imported already is the caller's to handle."""
    FINDER.add(name, callback)
