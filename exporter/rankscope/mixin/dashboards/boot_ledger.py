"""rankscope / Boot ledger: where the memory of a boot went, by phase, rank and card."""

from __future__ import annotations

from rankscope.mixin.config import Config
from rankscope.mixin.dashboards import dashboard, table, variable


def _posts(mark: str, view: str, what: str) -> dict:
    return table(
        f"Posts, {view} view",
        f"Bytes each phase took per rank and card, as {what} sees it (signed).",
        f'sum by (boot, rank, gpu, post) (rankscope_post_bytes{{{mark}, view="{view}"}})',
        unit="bytes",
        width=8,
    )


def build(c: Config) -> dict:
    s = c["selector"]
    arena = f'{s}, instance=~"$instance", boot=~"$boot"'
    mark = f'{arena}, gpu=~"$gpu"'
    phase = "rankscope_phase_timestamp_seconds"
    return dashboard(
        "rankscope-boot-ledger",
        "rankscope / Boot ledger",
        "Where the memory of a boot went: posts per rank and card by phase in the allocator, "
        "driver and process views, the non-torch residue and the KV arenas.",
        [
            variable("instance", "Host", f"{phase}{{{s}}}"),
            variable("boot", "Boot", f'{phase}{{{s}, instance=~"$instance"}}'),
            variable("gpu", "Card", f"{phase}{{{arena}}}"),
        ],
        [
            _posts(mark, "allocator", "torch's caching allocator"),
            _posts(mark, "driver", "the driver (free memory)"),
            _posts(mark, "process", "NVML's per-process bytes"),
            table(
                "Marks per rank",
                "Allocator reserved and allocated, NVML bytes of the process and driver free "
                "memory at each phase mark.",
                f"rankscope_phase_reserved_bytes{{{mark}}}",
                f"rankscope_phase_allocated_bytes{{{mark}}}",
                f"rankscope_phase_process_bytes{{{mark}}}",
                f"rankscope_phase_device_free_bytes{{{mark}}}",
                unit="bytes",
                width=24,
            ),
            table(
                "Non-torch residue",
                "NVML bytes of the process minus allocator reserved, signed: CUDA context, "
                "NCCL buffers, graph pools. Absent where the subtraction is no measurement.",
                f"rankscope_phase_non_torch_bytes{{{mark}}}",
                unit="bytes",
            ),
            table(
                "KV arenas: reserved versus backed",
                "Address space each arena reserved, the part backed by committed pages, parked "
                "handles, and the unbacked reservation (reserved minus backed).",
                f"rankscope_arena_reserved_bytes{{{arena}}}",
                f"rankscope_arena_backed_bytes{{{arena}}}",
                f"rankscope_arena_retained_bytes{{{arena}}}",
                f"rankscope_arena_reserved_bytes{{{arena}}} - rankscope_arena_backed_bytes{{{arena}}}",
                unit="bytes",
            ),
        ],
    )
