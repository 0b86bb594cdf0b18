"""CUDA graphs: collectives counted while a graph is captured (no other thread may issue any
meanwhile) are added again at every replay, since a replay never re-enters Python."""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Hashable, Iterator, MutableMapping
from typing import Any

from rankscope.rank.census import counts as _counts
from rankscope.rank.census.wrap import MARK, patch, undo_all
from rankscope.record import GraphCounts
from rankscope.record.naming import Key

log = logging.getLogger("rankscope.census")

# Per captured graph: its name, and what one replay counts with the replays so far.
Captured = tuple[str, GraphCounts]
_weak: weakref.WeakKeyDictionary[Any, Captured] = weakref.WeakKeyDictionary()
_strong: dict[Hashable, Captured] = {}
_open: dict[Hashable, tuple[str, dict[Key, int]]] = {}  # key -> (name, counts at begin)
_captured = 0
unknown_replays = 0


def _table(key: Any) -> MutableMapping[Any, Captured]:
    """Where ``key``'s entry lives: a graph object weakly (a dropped graph must free its pool),
    a plain key (a batch size, a name) strongly until forget()."""
    try:
        weakref.ref(key)
    except TypeError:
        return _strong
    return _weak


def begin_capture(key: Any, name: str | None = None) -> None:
    """Mark the start of capturing graph ``key`` (the graph object, or any hashable id)."""
    global _captured
    if not _counts.ARMED:
        return
    try:
        _captured += 1
        _open[key] = (name or f"graph{_captured}", _counts.snapshot())
    except Exception as exc:
        log.warning("rankscope census: capture of %r not tracked: %r", key, exc)


def end_capture(key: Any) -> GraphCounts | None:
    """A successful capture's end: what was counted since its begin, each replay issues."""
    if not _counts.ARMED:
        return None
    try:
        opened = _open.pop(key, None)
        if opened is None:
            return None
        name, before = opened
        now = _counts.snapshot()
        delta = {k: n - before.get(k, 0) for k, n in now.items() if n != before.get(k, 0)}
        entry = GraphCounts(delta, 0)
        _table(key)[key] = (name, entry)
        return entry
    except Exception as exc:
        log.warning("rankscope census: capture of %r not tracked: %r", key, exc)
        return None


def abandon_capture(key: Any) -> None:
    with contextlib.suppress(TypeError):
        _open.pop(key, None)


@contextlib.contextmanager
def capture(key: Any, name: str | None = None) -> Iterator[None]:
    """Wrap exactly the capture (``with torch.cuda.graph(g)``), not its warm-up runs: every
    collective counted inside is added again on each :func:`replay` of ``key``."""
    begin_capture(key, name)
    try:
        yield
    except BaseException:
        abandon_capture(key)
        raise
    end_capture(key)


def replay(key: Any, n: int = 1) -> None:
    """Count ``n`` replays of graph ``key``. Never raises; an unknown key is counted."""
    global unknown_replays
    if not _counts.ARMED:
        return
    try:
        found = _table(key).get(key)
        if found is None:
            unknown_replays += n
            return
        entry, table = found[1], _counts.COUNTS
        for k, per_replay in entry.counts.items():
            table[k] += per_replay * n
        entry.replays = (entry.replays or 0) + n
    except Exception as exc:
        log.warning("rankscope census: replay of %r not counted: %r", key, exc)


def forget(key: Any) -> None:
    """Drop what is known of graph ``key`` (a plain key is otherwise kept for good)."""
    _table(key).pop(key, None)


def graph_counts() -> dict[str, GraphCounts]:
    """A census snapshot's ``graphs``: per graph, what one replay counts, and the replays."""
    entries = [*_weak.values(), *_strong.values()]
    return {name: GraphCounts(dict(e.counts), e.replays) for name, e in entries}


def reset() -> None:
    global _captured, unknown_replays
    _weak.clear()
    _strong.clear()
    _open.clear()
    _captured = unknown_replays = 0


_GRAPH_METHODS = ("capture_begin", "capture_end", "replay")


def instrument_cuda_graphs(
    on_begin: Callable[[Any], None] | None = None, on_end: Callable[[Any], None] | None = None
) -> Callable[[], None]:
    """Track every ``torch.cuda.CUDAGraph`` capture and replay (SGLang's and vLLM's); the undo.
    ``on_begin(graph)`` runs before each capture begins and ``on_end(graph)`` after each ends
    (``rankscope run``'s marks): both must never raise."""
    import torch

    cls: Any = getattr(torch.cuda, "CUDAGraph", None)
    if cls is None or any(getattr(getattr(cls, n), MARK, False) for n in _GRAPH_METHODS):
        return lambda: None  # no graphs, or instrumented already: the first undo restores
    begin, end, replay_graph = (getattr(cls, n) for n in _GRAPH_METHODS)

    @functools.wraps(begin)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        if on_begin is not None:
            on_begin(self)
        result = begin(self, *args, **kwargs)
        begin_capture(self)
        return result

    @functools.wraps(end)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = end(self, *args, **kwargs)
        except BaseException:
            abandon_capture(self)
            raise
        end_capture(self)
        if on_end is not None:
            on_end(self)
        return result

    @functools.wraps(replay_graph)
    def replay_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = replay_graph(self, *args, **kwargs)
        replay(self)
        return result

    # Disarmed (rankscope run --no-census), the capture marks alone: replays stay unwrapped.
    wrappers = (capture_begin, capture_end, *([replay_method] if _counts.ARMED else []))
    for wrapper in wrappers:
        setattr(wrapper, MARK, True)
    return undo_all([patch(cls, w.__name__, w) for w in wrappers])
