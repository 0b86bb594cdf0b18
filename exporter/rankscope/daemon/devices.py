"""Device sources: each card's identity, free memory and process list, from NVML or from a
JSON script of simulated cards (docs/corridor.md). A source raises only DeviceError."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from rankscope.daemon.flags import parse_bytes
from rankscope.nvml_calls import memory_reader

log = logging.getLogger("rankscope.daemon")


class DeviceError(Exception):
    """A device source, or one of its cards, could not answer."""


@dataclass(frozen=True)
class CardIdentity:
    """``index`` is the gpu label (NVML's index); ``slot`` keys the reads (the card's
    position in the source's own list)."""

    slot: int
    index: int
    uuid: str
    model: str
    total: int


class DeviceSource(Protocol):
    """``name`` is the source label of rankscope_up and rankscope_gpu_info."""

    name: str
    incomplete: str | None  # why cards the source counts were left unread at the last open

    def open(self) -> list[CardIdentity]: ...

    def changed(self) -> bool: ...  # has the card list changed? Cheap: once per sample

    def read_free(self, slot: int) -> int: ...

    def read_processes(self, slot: int) -> dict[int, int | None]: ...  # host pid -> bytes

    def close(self) -> None: ...


def free_reader(nvml: Any) -> Callable[[Any], int]:
    """Free bytes of a card by rankscope.nvml_calls' one call, else by pynvml's wrapper."""
    read_memory = memory_reader(nvml, keep_gil=True)
    if read_memory is None:
        return lambda handle: int(nvml.nvmlDeviceGetMemoryInfo(handle).free)
    return lambda handle: read_memory(handle)[0]


class NvmlSource:
    """Real cards through NVML; handles are resolved once per :meth:`open`."""

    name = "nvml"

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []  # why, a string, for a card NVML cannot open
        self._meminfo: Callable[[Any], int] | None = None
        self._known: dict[int, CardIdentity] = {}  # by index, across opens
        self.incomplete: str | None = None

    def open(self) -> list[CardIdentity]:
        try:
            import pynvml
        except ImportError as exc:
            raise DeviceError(f"nvidia-ml-py (pynvml) is not installed: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError, or OSError from a missing libnvidia-ml
            raise DeviceError(f"NVML init failed: {exc}") from exc
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.close()
            raise DeviceError(f"NVML could not count the cards: {exc}") from exc
        cards: list[CardIdentity] = []
        handles: list[Any] = []
        problems: list[str] = []
        for index in range(count):
            slot = len(handles)
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                model = _text(pynvml.nvmlDeviceGetName(handle))
                total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
                ident = self._known[index] = CardIdentity(slot, index, uuid, model, total)
            except pynvml.NVMLError as exc:
                # A GPU that fell off the bus must not take the other cards down with it.
                problems.append(f"card {index}: {exc}")
                if index not in self._known:
                    continue  # never seen: nothing to name it by until it opens
                handle, ident = str(exc), replace(self._known[index], slot=slot)
            cards.append(ident)
            handles.append(handle)
        if count and not cards:
            self.close()
            raise DeviceError(f"NVML could not open any card: {'; '.join(problems)}")
        self._handles = handles
        self.incomplete = "NVML could not open " + "; ".join(problems) if problems else None
        self._meminfo = free_reader(pynvml)
        return cards

    def changed(self) -> bool:
        return False

    def read_free(self, slot: int) -> int:
        assert self._meminfo is not None, "read_free before open"
        try:
            return self._meminfo(self._handle(slot))
        except self._nvml.NVMLError as exc:
            raise DeviceError(f"NVML memory info of card slot {slot}: {exc}") from exc

    def read_processes(self, slot: int) -> dict[int, int | None]:
        nvml = self._nvml
        handle = self._handle(slot)
        held: dict[int, int | None] = {}
        for what, query in (
            ("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            try:
                procs = query(handle)
            except nvml.NVMLError as exc:
                if what == "graphics" and exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                    continue  # compute-only cards
                raise DeviceError(f"NVML {what} processes of card slot {slot}: {exc}") from exc
            for p in procs:
                used = p.usedGpuMemory  # None: NVML_VALUE_NOT_AVAILABLE
                # Listed twice (a compute and a graphics context), the same figure: once.
                if held.get(int(p.pid)) is None:
                    held[int(p.pid)] = None if used is None else int(used)
        return held

    def _handle(self, slot: int) -> Any:
        handle = self._handles[slot]
        if isinstance(handle, str):
            raise DeviceError(f"NVML card slot {slot} did not open: {handle}")
        return handle

    def close(self) -> None:
        if self._nvml is None:
            return
        self._handles, self._meminfo = [], None
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # already shut down, driver gone: nothing left to free
            log.debug("nvmlShutdown: %r", exc)
        self._nvml = None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class ScriptedCard:
    identity: CardIdentity
    free: int
    processes: dict[int, int | None]
    fail: str | None  # a message: reads of this card fail with it (a simulated lost GPU)


def parse_script(text: str, origin: str = "script") -> list[ScriptedCard]:
    """The scripted source's JSON -> cards; ValueError naming the file and the field."""

    def bad(what: str) -> ValueError:
        return ValueError(f"{origin}: {what}")

    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("cards"), list):
        raise bad('expected an object {"cards": [...]}')

    def size(where: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise bad(f"{where}: expected bytes (an integer or '2GiB'), got {value!r}")
        try:
            return parse_bytes(value)
        except ValueError as exc:
            raise bad(f"{where}: {exc}") from exc

    cards: list[ScriptedCard] = []
    for slot, raw in enumerate(doc["cards"]):
        where = f"cards[{slot}]"
        if not isinstance(raw, dict):
            raise bad(f"{where}: expected an object")
        index = raw.get("index", slot)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise bad(f"{where}.index: expected a card index, got {index!r}")
        uuid = raw.get("uuid", f"GPU-simulated-{index}")
        if not isinstance(uuid, str) or not uuid:
            raise bad(f"{where}.uuid: expected a string, got {uuid!r}")
        if any(c.identity.index == index or c.identity.uuid == uuid for c in cards):
            raise bad(f"{where}: card index {index} or uuid {uuid} listed twice")
        model = raw.get("model", "Simulated GPU")
        total = size(f"{where}.total", raw.get("total"))
        free = size(f"{where}.free", raw.get("free"))
        if free > total:
            raise bad(f"{where}: free {free} exceeds total {total}")
        procs_raw = raw.get("processes", {})
        if not isinstance(procs_raw, dict):
            raise bad(f"{where}.processes: expected an object pid -> bytes")
        procs: dict[int, int | None] = {}
        for pid_text, held in procs_raw.items():
            try:
                pid = int(pid_text)
            except ValueError:
                raise bad(f"{where}.processes: {pid_text!r} is not a pid") from None
            procs[pid] = None if held is None else size(f"{where}.processes[{pid_text}]", held)
        fail = raw.get("fail")
        if fail is not None and not isinstance(fail, str):
            raise bad(f"{where}.fail: expected a message string, got {fail!r}")
        identity = CardIdentity(slot, index, uuid, str(model), total)
        cards.append(ScriptedCard(identity, free, procs, fail))
    return cards


class ScriptedSource:
    """Simulated cards from a JSON file, re-read when its inode, size or mtime changes (one
    stat per sample): a writer scripts a trough by replacing the file."""

    name = "simulated"
    incomplete: str | None = None  # a script lists every card it has, or fails as a whole

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._cards: list[ScriptedCard] = []
        self._uuids: tuple[str, ...] = ()
        self._error: str | None = None

    def open(self) -> list[CardIdentity]:
        identities = self._load()
        self._uuids = tuple(i.uuid for i in identities)
        return identities

    def changed(self) -> bool:
        return tuple(i.uuid for i in self._load()) != self._uuids

    def _load(self) -> list[CardIdentity]:
        """The scripted cards, the file re-read if it changed; DeviceError while it is bad."""
        origin = f"simulated device script {self.path}"
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_size, st.st_mtime_ns) != self._stamp:
                self._stamp, self._error = (st.st_ino, st.st_size, st.st_mtime_ns), None
                self._cards = parse_script(self.path.read_text(), origin)
        except OSError as exc:
            self._stamp, self._cards, self._error = None, [], f"{origin}: {exc.strerror or exc}"
        except ValueError as exc:
            self._cards, self._error = [], str(exc)
        if self._error is not None:
            raise DeviceError(self._error)
        return [c.identity for c in self._cards]

    def _card(self, slot: int) -> ScriptedCard:
        if self._error is not None:
            raise DeviceError(self._error)
        if slot >= len(self._cards):
            raise DeviceError(f"simulated card slot {slot} is no longer scripted")
        card = self._cards[slot]
        if card.fail is not None:
            raise DeviceError(f"simulated card {card.identity.index}: {card.fail}")
        return card

    def read_free(self, slot: int) -> int:
        return self._card(slot).free

    def read_processes(self, slot: int) -> dict[int, int | None]:
        return dict(self._card(slot).processes)

    def close(self) -> None:
        self._stamp = None  # the next open reads the file again


def make_source(kind: str, script: str | None) -> DeviceSource:
    """``--device.source`` and ``--device.script`` -> a source (auto: the script if given)."""
    if kind == "script" or (kind == "auto" and script):
        if not script:
            raise ValueError("--device.source=script needs --device.script FILE")
        return ScriptedSource(script)
    if kind in ("nvml", "auto"):
        return NvmlSource()
    raise ValueError(f"--device.source: unknown source {kind!r} (auto, nvml, script)")


def write_script(path: str | os.PathLike[str], cards: list[dict[str, Any]]) -> None:
    """Replaces a simulated device script atomically: the sampler never reads half a file."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"cards": cards}))
    os.replace(tmp, target)
