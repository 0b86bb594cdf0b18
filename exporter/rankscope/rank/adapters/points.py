"""Hook points and the attach machinery shared by the framework adapters. An adapter declares
every place it touches in a framework as a :class:`HookPoint`, checked against the framework's
source (rankscope.rank.adapters.manifest). It attaches module by module as each is imported,
every hook point resolved before any is installed; on any failure everything installed is
undone, so the job runs untouched. Either way the process's record gets one ``adapter`` line
saying what attached, or which hook could not and why."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, NamedTuple

from rankscope.rank.writer import RECORDER
from rankscope.record import AdapterFailure, AdapterStatus

log = logging.getLogger("rankscope.adapters")

# wrap: the adapter replaces the method (marks, ticks); count: a census counter wraps it;
# call: the adapter calls it; read: the adapter reads it from the framework's objects.
Use = Literal["wrap", "count", "call", "read"]


@dataclass(frozen=True)
class HookPoint:
    """One place in the framework an adapter relies on: ``qualname`` is ``Class.member`` or a
    module-level ``function``; ``params`` the parameters it reads, as (name, position after
    self); ``optional`` a read with a fallback, which some checked versions may lack."""

    module: str
    qualname: str
    use: Use
    params: tuple[tuple[str, int], ...] = ()
    optional: bool = False

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}"


# An attach to an unchecked version, each hook point verified in its installed source.
ATTACHED_UNVERIFIED = "attached_unverified_version"

Undo = Callable[[], None]
# module -> the undo of everything it installed; raises AttachError when a point is missing.
Installer = Callable[[ModuleType], list[Undo]]


class AttachError(Exception):
    """A hook point could not be attached: names the point and why."""

    def __init__(self, point: str, why: str) -> None:
        super().__init__(f"{point}: {why}")
        self.point, self.why = point, why


def resolve(module: ModuleType, point: HookPoint) -> tuple[Any, str]:
    """(owner, member) of a wrap/count/call point in an imported module, or AttachError."""
    cls_name, _, member = point.qualname.rpartition(".")
    owner: Any = getattr(module, cls_name, None) if cls_name else module
    if owner is None:
        raise AttachError(point.name, f"{point.module} has no {cls_name}")
    current = getattr(owner, member, None)
    if current is None or not callable(current):
        raise AttachError(point.name, f"{cls_name or point.module} has no {member}")
    if isinstance(owner, type) and point.use in ("wrap", "count"):
        if member not in owner.__dict__:
            raise AttachError(point.name, f"{member} is inherited, not defined on {cls_name}")
        if isinstance(owner.__dict__[member], (staticmethod, classmethod)):
            raise AttachError(point.name, f"{member} is not an instance method")
    return owner, member


# (self, args after self, kwargs): run before or after a wrapped method
Hook = Callable[[Any, tuple[Any, ...], dict[str, Any]], object]


class Wrap(NamedTuple):
    """What an adapter runs around one method, and the parameters its hooks read, as (name,
    position after self): the method's wrap point declares them."""

    before: Hook | None = None
    after: Hook | None = None
    params: tuple[tuple[str, int], ...] = ()


def wrap_method(cls: type, name: str, wrap: Wrap) -> Undo:
    """Replace ``cls.name`` by a wrapper that runs ``wrap.before`` and, when the call returns,
    ``wrap.after``, each costing a log line if it fails, never the call. Returns the undo."""
    original = cls.__dict__[name]
    before, after = wrap.before, wrap.after

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            _guarded(before, name, self, args, kwargs)
        result = original(self, *args, **kwargs)
        if after is not None:
            _guarded(after, name, self, args, kwargs)
        return result

    setattr(cls, name, wrapper)
    return functools.partial(setattr, cls, name, original)


_warned: set[str] = set()


def _guarded(fn: Callable[..., object], where: str, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:  # an adapter may cost a log line, never the framework's call
        if where not in _warned:
            _warned.add(where)
            log.warning("rankscope adapter: hook around %s failed: %r; carrying on", where, exc)


def is_checked(version: str | None, checked: tuple[str, ...]) -> bool:
    """Whether an installed version is one the adapter was checked against. A local label
    (``0.34.0+cu130``, a build of the same release for another CUDA) is the same source."""
    return version is not None and version.split("+", 1)[0] in checked


class Adapter:
    """One framework's adapter: subclasses give its checked versions, its hook points and
    ``installers``, each module's function that attaches its hooks."""

    framework: str = ""
    distribution: str = ""
    checked_versions: tuple[str, ...] = ()
    points: tuple[HookPoint, ...] = ()
    # Modules imported late, after the boot has started (attached whenever they come).
    deferred: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.state: Literal["idle", "attaching", "attached", "off"] = "idle"
        self.version: str | None = None
        self._undo: list[Undo] = []
        self._done: set[str] = set()
        self.hooks: list[str] = []
        self.booted = False  # first_forward marked
        self.unverified = False  # attached to a version verified at run time, not checked
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        # A forked child (vLLM's default worker start) inherits the hooks, and gets its line.
        self._lock = threading.RLock()
        if self.state == "attached":
            self._write()

    def installers(self) -> dict[str, Installer]:
        raise NotImplementedError

    def modules(self) -> list[str]:
        return list(self.installers())

    def on_import(self, module: ModuleType) -> None:
        """Called by the import hook once ``module`` has executed. Never raises."""
        try:
            with self._lock:
                self._on_import(module)
        except Exception as exc:
            log.warning("rankscope adapter %s: %r; not attached", self.framework, exc)
            self._give_up(module.__name__, f"adapter error {exc!r}")

    def _on_import(self, module: ModuleType) -> None:
        name = module.__name__
        if self.state == "off" or name in self._done:
            return
        if self.state == "idle":
            with contextlib.suppress(Exception):  # no distribution metadata: None
                self.version = importlib.metadata.version(self.distribution)
            if not is_checked(self.version, self.checked_versions):
                # imported here: the manifest's check needs this module
                from rankscope.rank.adapters.manifest import unchecked_failure

                failed = unchecked_failure(self, name)
                if failed is not None:
                    self._give_up(*failed)
                    return
                self.unverified = True
            self.state = "attaching"
            # A process that imports only some of the modules (a front-end process) still
            # gets its one line, at exit, with the modules that never came as pending.
            atexit.register(self._attached)
        install = self.installers()[name]
        try:
            self._undo.extend(install(module))
        except AttachError as exc:
            self._give_up(exc.point, exc.why)
            return
        self._done.add(name)
        self.hooks.extend(
            p.name for p in self.points if p.module == name and p.use in ("wrap", "count")
        )
        if set(self.installers()) - set(self.deferred) <= self._done:
            self._attached()

    def _attached(self) -> None:
        with self._lock:
            if self.state == "attaching":
                self.state = "attached"
                self._write()

    def _give_up(self, point: str, why: str) -> None:
        was = self.state
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception as exc:
                log.warning("rankscope adapter %s: undo failed: %r", self.framework, exc)
        self._undo.clear()
        self.state, self.hooks = "off", []
        log.warning(
            "rankscope adapter %s: %s could not attach (%s); the job runs without it",
            self.framework,
            point,
            why,
        )
        self._write(AdapterFailure(point, why), "detached" if was == "attached" else "not_attached")

    def _write(self, failed: AdapterFailure | None = None, status: str = "not_attached") -> None:
        """The one ``adapter`` line: attached (with the modules still pending), or ``failed``."""
        attached = ATTACHED_UNVERIFIED if self.unverified else "attached"
        pending = () if failed else tuple(m for m in self.installers() if m not in self._done)
        RECORDER.write_record(
            AdapterStatus(
                framework=self.framework,
                status=status if failed else attached,
                version=self.version,
                checked_versions=self.checked_versions,
                hooks=tuple(self.hooks),
                pending=pending,
                failed=failed,
            )
        )


def points_of(adapter: Adapter, module: str, use: tuple[Use, ...]) -> list[HookPoint]:
    return [p for p in adapter.points if p.module == module and p.use in use]
