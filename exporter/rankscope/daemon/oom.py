"""The OOM source: the probes' ``oom`` lines, and the exhaustions no allocator saw (an NCCL
buffer, another process) that the sampler sees as a card's free memory near zero.
:class:`OomBook` merges both."""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

from rankscope.daemon.flightstate import FlightState, RankProcess
from rankscope.daemon.holdings import attribute
from rankscope.daemon.sampler import CardState, FloorValue, Sampler
from rankscope.procfs import RankIndex, read_proc_info
from rankscope.record import Line, Oom
from rankscope.reports.oom import Holding, OomEvent, SamplerOom, oom_events

log = logging.getLogger("rankscope.daemon")

DEFAULT_EXHAUSTED_BELOW = "256MiB"
MAX_EXHAUSTIONS_PER_CARD = 64  # the newest are kept; the count goes on


@dataclass(eq=False)
class ExhaustionWatch:
    """The sampler's hook: a card at or below ``threshold`` free is exhausted; its process
    list is read once at the onset, then only the worst minimum is followed."""

    sampler: Sampler
    rank_processes: Callable[[], list[RankProcess]]
    threshold: FloorValue
    _: KW_ONLY
    proc: str = "/proc"
    wall: Callable[[], float] = time.time
    process_list_reads: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _counts: dict[str, int] = field(default_factory=dict, init=False)  # by uuid
    _events: dict[str, list[SamplerOom]] = field(default_factory=dict, init=False)  # the newest
    _exhausted: set[str] = field(default_factory=set, init=False)  # uuids, as of the last read

    def __post_init__(self) -> None:
        self.sampler.on_read = self.read

    def read(self, card: CardState, free: int) -> None:
        """Called by the sampler with each card read. Never raises."""
        ident = card.identity
        try:
            if free > self.threshold.resolve(ident.total):
                self._exhausted.discard(ident.uuid)
            elif ident.uuid in self._exhausted:  # still exhausted: follow the worst minimum
                with self._lock:
                    kept = self._events.get(ident.uuid)
                    if kept and free < (kept[-1].free or 0):  # never None: the watch sets it
                        kept[-1] = replace(kept[-1], wall=self.wall(), free=free)
            else:  # the onset
                self._exhausted.add(ident.uuid)
                wall = self.wall()
                holders, why = self._read_holders(card)
                event = SamplerOom(wall, ident.index, ident.uuid, free, wall, free, holders, why)
                with self._lock:
                    self._counts[ident.uuid] = self._counts.get(ident.uuid, 0) + 1
                    events = self._events.setdefault(ident.uuid, [])
                    events.append(event)
                    del events[:-MAX_EXHAUSTIONS_PER_CARD]
                log.warning(
                    "card %s (%s) exhausted: %d bytes free; holders %s",
                    ident.index,
                    ident.uuid,
                    free,
                    ", ".join(f"{h.pid} {h.comm} {h.role} {h.bytes}" for h in holders or ()),
                )
        except Exception:  # the sampler's thread goes on whatever happens here
            log.exception("exhaustion watch failed on card %s", ident.index)

    def _read_holders(self, card: CardState) -> tuple[tuple[Holding, ...] | None, tuple[str, ...]]:
        self.process_list_reads += 1
        try:
            held = self.sampler.source.read_processes(card.identity.slot)
        except Exception as exc:
            return None, (f"process list read failed: {exc}",)
        try:
            index = RankIndex(self.rank_processes())
        except Exception as exc:
            log.warning("exhaustion: rank processes unread (%s); every holder is foreign", exc)
            index = RankIndex(())
        infos = {pid: read_proc_info(pid, self.proc) for pid in held}
        return tuple(attribute(held, infos, index)), ()

    def counts(self) -> dict[tuple[int | None, str], int]:
        with self._lock:
            return {(e[-1].gpu, uuid): self._counts[uuid] for uuid, e in self._events.items()}

    def events(self) -> list[SamplerOom]:
        with self._lock:
            return [e for events in self._events.values() for e in events]


OomInstant = OomEvent | SamplerOom  # a probe's or the sampler's


def instant_json(i: OomInstant) -> dict[str, Any]:
    """The API's form (/api/v1/oom): a probe's is what `rankscope oom --json` prints."""
    return {"source": "probe", **i.as_json()} if isinstance(i, OomEvent) else i.as_json()


class OomBook:
    """Both sources of OOM instants, for the collector and the API."""

    def __init__(self, state: FlightState, watch: ExhaustionWatch | None) -> None:
        self.state = state
        self.watch = watch
        self._lock = threading.Lock()
        # The oom lines and rank processes last parsed, and their instants.
        self._parsed: tuple[list[Line[Oom]], list[RankProcess], list[OomEvent]] = ([], [], [])

    def probe_instants(self) -> list[OomEvent]:
        """Every oom line in the flight directory, oldest first; parsed again only when the
        lines or the rank processes changed."""
        self.state.refresh_if_older(2.0)  # the daemon's refresher keeps it younger
        view = self.state.view()
        records = [rec for st in view.streams for rec in st.ooms]
        if not records:  # the usual scrape: no rank process list to build, no /proc to read
            return []
        ranks = view.rank_processes()
        with self._lock:
            old_records, old_ranks, events = self._parsed
            # The lines are the flight state's own objects, kept alive here: identity is change.
            same = len(records) == len(old_records) and all(map(operator.is_, records, old_records))
            if not same or ranks != old_ranks:
                # (host pid, start ticks) -> (boot, rank), as the flight state resolved them.
                named: dict[tuple[int, int], tuple[str, int | None]] = {}
                for rp in ranks:
                    host = self.state.process_host_pid(rp)
                    if host is not None and rp.start_ticks is not None:
                        named.setdefault((host, rp.start_ticks), (rp.boot, rp.rank))
                events = oom_events(
                    records,
                    namer=lambda pid, start: None if start is None else named.get((pid, start)),
                    resolve=self.state.host_pid,
                )
                self._parsed = (records, ranks, events)
            return events

    def instants(self) -> list[OomInstant]:
        """Every OOM both sources know, oldest first."""
        sampled = self.watch.events() if self.watch is not None else []
        return sorted([*self.probe_instants(), *sampled], key=lambda i: i.wall)

    def latest_by_card(self) -> dict[str, OomInstant]:
        return {i.uuid: i for i in self.instants() if i.uuid is not None}
