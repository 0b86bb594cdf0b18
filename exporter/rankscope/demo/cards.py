"""The demo's simulated cards without a GPU: the daemon's scripted device source
(docs/corridor.md), rewritten as the scenario goes. The pids on them are real processes;
only their byte counts are made up, a rank's following its latest boot phase."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankscope.daemon.devices import write_script

GiB = 1024**3
MiB = 1024**2

CARD_TOTAL = 80 * GiB
CARD_MODEL = "simulated 80 GiB card"
DRIVER_RESERVED = 256 * MiB  # held by the driver and no process: the unattributed share
FLOOR = 6 * GiB
# Two ranks' full holdings (2 x 32.5 GiB) plus the foreign holder fit one card above its
# floor; more ranks get more cards, as a real job would.
RANKS_PER_CARD = 2

# What a rank holds once it reached a phase: CUDA context, weights, KV pool.
RANK_BYTES_BY_PHASE: dict[str, int] = {
    **dict.fromkeys(("process_start", "nccl_init_begin", "nccl_init_end"), 0),
    "pre_weight_load": 512 * MiB,
    "weights_loaded": 512 * MiB + 12 * GiB,
    "kv_pool_sized": 512 * MiB + 12 * GiB + 20 * GiB,
}
FOREIGN_BYTES = 4608 * MiB  # "Process 1920108 has 4.29 GiB in use" was 4.5 GiB
TROUGH_BELOW_FLOOR = 2 * GiB  # how far the trough takes a card below its floor


def rank_bytes(phase: str) -> int:
    """Bytes a simulated rank holds after its latest phase (past kv_pool_sized: all)."""
    return RANK_BYTES_BY_PHASE.get(phase, RANK_BYTES_BY_PHASE["kv_pool_sized"])


@dataclass
class SimulatedCards:
    """The state behind the script: which real pid holds how much on which card."""

    path: Path
    count: int = 2

    def __post_init__(self) -> None:
        self.holders: list[dict[int, int]] = [{} for _ in range(self.count)]

    @classmethod
    def for_ranks(cls, path: Path, ranks: int) -> SimulatedCards:
        return cls(path, count=max(-(-ranks // RANKS_PER_CARD), 1))

    def card_of_rank(self, rank: int) -> int:
        return rank % self.count

    def set_holder(self, card: int, pid: int, held: int) -> None:
        self.holders[card][pid] = held
        self.write()

    def drop_holder(self, pid: int) -> None:
        if [held.pop(pid) for held in self.holders if pid in held]:
            self.write()

    def clear(self) -> None:
        self.holders = [{} for _ in range(self.count)]
        self.write()

    def free(self, card: int) -> int:
        return max(CARD_TOTAL - DRIVER_RESERVED - sum(self.holders[card].values()), 0)

    def bytes_to_leave(self, card: int, free: int) -> int:
        return max(self.free(card) - free, 0)

    def write(self) -> None:
        cards = [
            {
                "index": i,
                "uuid": f"GPU-simulated-demo-{i}",
                "model": CARD_MODEL,
                "total": CARD_TOTAL,
                "free": self.free(i),
                "processes": {str(pid): held for pid, held in sorted(self.holders[i].items())},
            }
            for i in range(self.count)
        ]
        write_script(self.path, cards)
