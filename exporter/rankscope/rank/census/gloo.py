"""The optional in-process comparison: at each snapshot round the ranks gather their counts
over a CPU (gloo) group, never the device's (a wedged device must not silence it), on a
thread of its own so ``tick()`` never waits; a divergence is logged and recorded. A failed
gather (a dead peer, the group's timeout) ends the comparison with one log line."""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import queue
import threading
from typing import Any

from rankscope.rank import stop_before_teardown
from rankscope.rank.census import counts as _counts
from rankscope.rank.census import snapshots
from rankscope.rank.census.wrap import GUARD
from rankscope.rank.writer import RECORDER
from rankscope.record import Divergence, encode_counts
from rankscope.record.compare import Entry, compare_ranks
from rankscope.record.naming import Key

log = logging.getLogger("rankscope.census")

DEFAULT_TIMEOUT_S = 60.0


def describe(entry: Entry) -> str:
    counts = " ".join(f"{r}:{n}" for r, n in entry["counts"].items())
    lagging = ",".join(str(r) for r in entry["lagging"])
    return f"{entry['group']} {entry['op']} counts {counts}, lagging rank(s) {lagging}"


class Comparator:
    """Gathers (round, counts) over ``group`` on a daemon thread, round by round."""

    def __init__(self, dist: Any, group: Any, rank: int, own_group: bool, timeout_s: float) -> None:
        self.dist = dist
        self.group = group
        self.timeout_s = timeout_s  # the group's: how long one gather can wait for a peer
        self.own_group = own_group  # enable_comparison's: destroyed with the comparator
        self.rank = rank
        self.compared = 0
        self.divergences: list[tuple[int, Entry]] = []
        self.failed: BaseException | None = None
        self._signatures: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._queue: queue.Queue[tuple[int, dict[Key, int]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rankscope-census", daemon=True)
        self._thread.start()
        if not stop_before_teardown(self._stop_at_exit):
            atexit.register(self._stop_at_exit)

    def submit(self, round_: int, counts: dict[Key, int]) -> None:
        if self.failed is None:
            self._queue.put_nowait((round_, counts))

    def close(self, timeout: float) -> bool:
        """Stop after the rounds already submitted; True when the thread has ended and the group
        this comparator created is destroyed (freed at the interpreter's teardown, it aborts)."""
        self._queue.put_nowait(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if self.own_group and self.group is not None:
            group, self.group = self.group, None  # first: the armed destroy hook closes it again
            try:
                self.dist.destroy_process_group(group)
            except Exception as exc:
                log.info("rankscope census: the comparison group was not destroyed: %r", exc)
        return True

    def _stop_at_exit(self) -> None:
        """Before torch tears down (a thread left in a gloo call then aborts the process), wait
        for the submitted rounds as long as one gather may take (the group's timeout at worst)."""
        wait = self.timeout_s + 5.0
        if not self.close(wait):
            log.warning(
                "rankscope census: the comparison thread is still in a gather after %.0f s; "
                "a peer is probably gone",
                wait,
            )

    def _run(self) -> None:
        GUARD.depth = 1  # this thread's own gathers are not the job's collectives
        for item in iter(self._queue.get, None):
            try:
                self.compare_round(*item)
            except Exception as exc:
                self.failed = exc
                log.warning(
                    "rankscope census: in-process comparison stopped at round %d: %r "
                    "(a peer may be gone; snapshots continue)",
                    item[0],
                    exc,
                )
                return

    def compare_round(self, round_: int, counts: dict[Key, int]) -> None:
        mine = {"rank": self.rank, "round": round_, "counts": encode_counts(counts)}
        gathered = [
            json.loads(raw)
            for raw in gather_bytes(self.dist, self.group, json.dumps(mine).encode())
        ]
        rounds = {g["round"] for g in gathered}
        if len(rounds) != 1:
            log.warning(
                "rankscope census: ranks reported different rounds %s; not compared", sorted(rounds)
            )
            return
        per_rank = {
            int(g["rank"]): {(grp, op): int(n) for grp, op, n in g["counts"]} for g in gathered
        }
        self.compared += 1
        # Log a divergence when it appears or changes, record it each round it lasts, and
        # record (with no lagging rank) the round at which the counts agree again.
        for entry in compare_ranks(per_rank):
            key = (entry["group"], entry["op"])
            tally = entry["counts"]
            if entry["divergent"]:
                self.divergences.append((round_, entry))
                top = max(tally.values())
                signature = (tuple(entry["lagging"]), tuple(top - n for n in tally.values()))
                if self._signatures.get(key) != signature:
                    self._signatures[key] = signature
                    log.warning(
                        "rankscope census: divergence at round %d: %s", round_, describe(entry)
                    )
            elif key in self._signatures:
                del self._signatures[key]
                log.info("rankscope census: %s %s agrees again at round %d", *key, round_)
            else:
                continue
            # The lowest member records it, so each group's divergence lands on its host.
            by_rank = {int(r): n for r, n in tally.items()}
            if RECORDER.armed and min(by_rank) == self.rank:
                RECORDER.write_record(Divergence(round_, *key, by_rank, tuple(entry["lagging"])))


def gather_bytes(dist: Any, group: Any, data: bytes) -> list[bytes]:
    """Every member's ``data`` in rank order, by two all_gathers (all_gather_object needs numpy)."""
    import torch

    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
    lengths = [int(s.item()) for s in sizes]
    mine = torch.zeros(max(lengths), dtype=torch.uint8)
    mine[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    return [bytes(t[:n].tolist()) for t, n in zip(gathered, lengths, strict=True)]


_active: Comparator | None = None


def enable_comparison(group: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Comparator | None:
    """Compare counts across ranks at every snapshot round over the gloo group ``group``,
    which nothing else may use, or over one it creates (a collective: every rank calls this in
    the same order among its new_group calls). None, logged, when torch.distributed is not
    initialised or the census is disarmed; never raises."""
    global _active
    if not _counts.ARMED:
        return None
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            log.warning(
                "rankscope census: torch.distributed is not initialised; no in-process comparison"
            )
            return None
        own = group is None
        if own:
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        elif dist.get_backend(group) != "gloo":
            log.warning(
                "rankscope census: the comparison group's backend is %s, not gloo; a wedged "
                "device must not silence the comparison, so it is not enabled",
                dist.get_backend(group),
            )
            return None
        rank = dist.get_rank()
        if RECORDER.rank.rank is None:
            RECORDER.configure(rank=rank, world_size=dist.get_world_size())
        disable_comparison()
        _active = Comparator(dist, group, rank, own, timeout_s)
        snapshots.STATE.on_snapshot = _active.submit
        return _active
    except Exception as exc:
        log.warning("rankscope census: in-process comparison not enabled: %r", exc)
        return None


def disable_comparison(timeout: float = 5.0) -> None:
    """Stop after the rounds submitted; a gather still running after ``timeout`` ends at exit."""
    global _active
    comparator, _active = _active, None
    snapshots.STATE.on_snapshot = None
    if comparator is not None:
        comparator.close(timeout)
