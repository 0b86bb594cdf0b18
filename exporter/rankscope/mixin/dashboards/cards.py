"""rankscope / Cards: per card, free memory against the corridor floor, who holds the memory,
and its out-of-memory instants."""

from __future__ import annotations

from rankscope.mixin.config import Config
from rankscope.mixin.dashboards import dashboard, increase, table, timeseries, variable

# The legend that names a card.
CARD = "{{instance}} gpu {{gpu}}"
_ROLE_COLOURS = {
    "foreign": {"color": "red", "index": 0, "text": "FOREIGN"},
    "rank": {"color": "green", "index": 1},
    "overflow": {"color": "orange", "index": 2},
}
# Table override: the role column turns red for foreign processes.
FOREIGN_IN_RED = [
    {
        "matcher": {"id": "byName", "options": "role"},
        "properties": [
            {"id": "mappings", "value": [{"type": "value", "options": _ROLE_COLOURS}]},
            {"id": "custom.cellOptions", "value": {"type": "color-background"}},
        ],
    }
]
_PROCESS = "instance, gpu, uuid, pid, comm, role, boot, rank"


def build(c: Config) -> dict:
    s = c["selector"]
    card = f'{s}, instance=~"$instance", gpu=~"$gpu"'
    host = f'{s}, instance=~"$instance"'
    panels = [
        # The corridor: free memory at its worst instant against the floor.
        timeseries(
            "Free memory, window minimum and floor",
            "Latest free memory, its minimum over the sampler's trailing window (the worst "
            "instant, a trough between scrapes included) and the card's floor.",
            (f"rankscope_gpu_free_bytes{{{card}}}", f"{CARD} free"),
            (f"rankscope_gpu_free_min_bytes{{{card}}}", f"{CARD} window min"),
            (f"rankscope_corridor_floor_bytes{{{card}}}", f"{CARD} floor"),
            unit="bytes",
        ),
        timeseries(
            "Corridor margin",
            "Worst-instant free memory minus the floor (signed); below zero is a breach.",
            (f"rankscope:corridor_margin_bytes{{{card}}}", CARD),
            unit="bytes",
        ),
        timeseries(
            "Time below the floor",
            "Seconds per interval the card's free memory spent below its floor, and how "
            "many times it crossed below.",
            (
                increase("rankscope_corridor_breach_seconds_total", card),
                f"{CARD} seconds below",
            ),
            (increase("rankscope_corridor_breaches_total", card), f"{CARD} crossings"),
        ),
        # Who holds the memory.
        timeseries(
            "Card identity",
            "Total = rank-resident + foreign + free + unattributed. Unattributed is signed "
            "(context, driver, sampling skew) and shown, not hidden.",
            (f"rankscope_gpu_rank_resident_bytes{{{card}}}", f"{CARD} rank-resident"),
            (f"rankscope_gpu_foreign_bytes{{{card}}}", f"{CARD} foreign"),
            (f"rankscope_gpu_free_bytes{{{card}}}", f"{CARD} free"),
            (f"rankscope_gpu_unattributed_bytes{{{card}}}", f"{CARD} unattributed"),
            unit="bytes",
            stack=True,
        ),
        table(
            "Holdings per process",
            "Every process NVML lists on the card; role foreign (red) is no rank of any boot.",
            f'max by ({_PROCESS}) (rankscope_gpu_process_bytes{{{card}, boot=~"$boot|"}})',
            unit="bytes",
            overrides=FOREIGN_IN_RED,
        ),
        timeseries(
            "Foreign holdings",
            "Memory held by processes that are no rank of any boot, by pid and comm.",
            (
                f'rankscope_gpu_process_bytes{{{card}, role="foreign"}}',
                CARD + " pid {{pid}} {{comm}}",
            ),
            unit="bytes",
        ),
        # Out-of-memory instants.
        timeseries(
            "Out-of-memory instants",
            "OOMs per interval: a rank's allocator failed (boot, rank, pid), or the sampler "
            "saw the card's free memory at or below --oom.free-below (no pid).",
            (increase("rankscope_oom_events_total", card), CARD + " rank {{rank}} pid {{pid}}"),
        ),
        table(
            "Holders at the latest OOM",
            "Every process on the card at its latest OOM instant, largest first; role "
            "foreign (red) is no rank of any boot. `rankscope oom DIR` prints the whole "
            "instant.",
            f"sort_desc(max by ({_PROCESS}) (rankscope_oom_holder_bytes{{{card}}}))",
            unit="bytes",
            overrides=FOREIGN_IN_RED,
        ),
        table(
            "Cards",
            "Card identity: model, and whether the device source is NVML or simulated.",
            f"rankscope_gpu_info{{{card}}}",
            f"rankscope_gpu_total_bytes{{{card}}}",
            width=24,
        ),
    ]
    return dashboard(
        "rankscope-cards",
        "rankscope / Cards",
        "Per card: free memory at its worst instant against the corridor floor, time below "
        "the floor, who holds the memory (ranks, foreign processes) and the card identity.",
        [
            variable("instance", "Host", f"rankscope_gpu_total_bytes{{{s}}}", include_all=False),
            variable("gpu", "Card", f"rankscope_gpu_total_bytes{{{host}}}"),
            variable("boot", "Boot", f'rankscope_gpu_process_bytes{{{host}, role="rank"}}'),
        ],
        panels,
    )
