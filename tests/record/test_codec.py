"""The record's codec against the format on disk: every kind encodes to the very JSON text the
writer produced before the codec (hard-coded below, times masked), parses back what it wrote,
and a line's whole text is its header's members, then its body's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankscope.rank.writer import ENCODER, Recorder, line_encoder
from rankscope.record import (
    KINDS,
    AdapterFailure,
    AdapterStatus,
    BlockedIn,
    Census,
    CensusDump,
    CensusLive,
    Divergence,
    GraphCounts,
    GroupFields,
    Header,
    Mark,
    MarkArena,
    MarkDerived,
    MarkDevice,
    MarkDriver,
    MarkFields,
    MarkNvml,
    MarkTorch,
    Oom,
    OomAllocator,
    OomHolder,
    OomPool,
    PoolFields,
    ProcessIdentity,
    ProcessStartFields,
    RankIdentity,
    Sample,
    parse_object,
)
from rankscope.record.codec import MAX_BYTES

MiB = 1 << 20


def full_mark(extra=None):
    return Mark(
        'weights "loaded" \u00e9',
        {"shards": 4, "ratio": 0.25, "tags": ["a", None, True], "nested": {"k": -1}}
        if extra is None
        else extra,
        MarkDevice(0, "GPU-1234", 3, None),
        MarkTorch(512 * MiB, 300 * MiB, 450 * MiB, 2, 0, None),
        MarkDriver(70_000 * MiB, 80_000 * MiB, None),
        MarkNvml(1012 * MiB, {4242: 4400 * MiB, 77: None}, None),
        {"kv": MarkArena(100, 40, 7, None), "odd\n": MarkArena(None, None, None, "x")},
        MarkDerived(-500 * MiB, True, 60),
    )


def views(why="CUDA not initialised"):
    return dict(
        device=MarkDevice(why=why),
        torch=MarkTorch(why=why),
        driver=MarkDriver(why=why),
        nvml=MarkNvml(why=why),
    )


SAMPLES = {
    "header": Header(
        v=1,
        kind="mark",
        boot="b\u00e9",
        host="h",
        pid=12,
        wall=1700000000.25,
        mono=12.5,
        rank=1,
        local_rank=1,
        world_size=4,
        tp_rank=0,
        pp_rank=1,
        runner="draft",
        start_ticks=999,
        nspid=(12, 3),
        pidns=4026531836,
        file="x.jsonl",
    ),
    "header none": Header(v=1, kind="census", boot="b", host="h", pid=1, wall=2.0),
    "mark": full_mark(),
    "mark none": Mark("p"),
    "mark cpu": Mark("pre", {}, **views()),
    "mark process_start": full_mark(ProcessStartFields("3.12.1")),
    "mark forked": full_mark(ProcessStartFields(forked=True)),
    "mark group": full_mark(GroupFields(0.1234567, "world:0", [0, 1, 7], "nccl")),
    "mark group member": full_mark(GroupFields(None, None, None, None, member=False)),
    "mark pool": full_mark(PoolFields((1, 2), 2 * MiB, None)),
    "mark pool none": full_mark(PoolFields(None, None, "pool unreadable")),
    "sample": Sample.of(full_mark()),
    "sample none": Sample(),
    "census": Census(
        5,
        10,
        {("tp:0-1", "all_reduce"): 4, ("dp:0,2", "barrier"): 1},
        {"g1": GraphCounts({("tp:0-1", "all_gather"): 2}, 7)},
    ),
    "census none": Census(None, None, None),
    "census_dump": CensusDump(
        reason="SIGTERM",
        round=5,
        every=10,
        counts={("w", "send:1"): 3},
        graphs={"g": GraphCounts({}, None)},
    ),
    "census_dump none": CensusDump(reason=None, round=None, every=None, counts=None),
    "divergence": Divergence(7, "tp:0-1", "all_reduce", {0: 5, 1: 4}, (1,)),
    "divergence agree": Divergence(None, "g", "op", {}, ()),
    "adapter": AdapterStatus(
        framework="vllm",
        status="attached",
        version="0.6.0",
        checked_versions=("0.6.0", "0.6.1"),
        hooks=("a.b", "c.d"),
        pending=("e",),
    ),
    "adapter failed": AdapterStatus(
        framework="sglang", status="not_attached", failed=AdapterFailure("x.y", "gone")
    ),
    "adapter none": AdapterStatus(framework="f", status="detached"),
    "oom": Oom(
        2 * MiB,
        10,
        80_000 * MiB,
        MarkDevice(1, "GPU-9", 1, None),
        OomAllocator(5, 4, 1, 3, None),
        {"large": OomPool(2, 4, 3), "private:1,2": OomPool(1, 1, 0)},
        1024,
        None,
        MarkDriver(1, 2, None),
        MarkNvml(3, {5: 6}, None),
        [OomHolder(5, 6, "python", 77), OomHolder(8)],
        "warmup",
        1700000000.5,
        None,
        True,
        None,
    ),
    "oom none": Oom(),
}


# What the writer wrote for each, before the codec (generated once from the old schema).
EXPECTED = {
    "header": '{"v":1,"kind":"mark","boot":"b\\u00e9","rank":1,"local_rank":1,"world_size":4,"tp_rank":0,"pp_rank":1,"runner":"draft","host":"h","pid":12,"start_ticks":999,"nspid":[12,3],"pidns":4026531836,"mono":12.5,"wall":1700000000.25}',
    "header none": '{"v":1,"kind":"census","boot":"b","rank":null,"local_rank":null,"world_size":null,"tp_rank":null,"pp_rank":null,"runner":null,"host":"h","pid":1,"start_ticks":null,"nspid":null,"pidns":null,"mono":null,"wall":2.0}',
    "mark": '{"phase":"weights \\"loaded\\" \\u00e9","extra":{"shards":4,"ratio":0.25,"tags":["a",null,true],"nested":{"k":-1}},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "mark none": '{"phase":"p","extra":{},"device":{"index":null,"uuid":null,"nvml_index":null,"why":null},"torch":{"reserved":null,"allocated":null,"peak_allocated":null,"num_alloc_retries":null,"num_ooms":null,"why":null},"driver":{"free":null,"total":null,"why":null},"nvml":{"self_bytes":null,"procs":null,"why":null},"arenas":{},"derived":{"non_torch":null,"non_torch_measured":false,"unbacked_reservation":null}}',
    "mark cpu": '{"phase":"pre","extra":{},"device":{"index":null,"uuid":null,"nvml_index":null,"why":"CUDA not initialised"},"torch":{"reserved":null,"allocated":null,"peak_allocated":null,"num_alloc_retries":null,"num_ooms":null,"why":"CUDA not initialised"},"driver":{"free":null,"total":null,"why":"CUDA not initialised"},"nvml":{"self_bytes":null,"procs":null,"why":"CUDA not initialised"},"arenas":{},"derived":{"non_torch":null,"non_torch_measured":false,"unbacked_reservation":null}}',
    "mark process_start": '{"phase":"weights \\"loaded\\" \\u00e9","extra":{"python":"3.12.1"},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "mark forked": '{"phase":"weights \\"loaded\\" \\u00e9","extra":{"forked":true},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "mark group": '{"phase":"weights \\"loaded\\" \\u00e9","extra":{"seconds":0.1234567,"group":"world:0","ranks":[0,1,7],"backend":"nccl"},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "mark group member": '{"phase":"weights \\"loaded\\" \\u00e9","extra":{"seconds":null,"group":null,"ranks":null,"backend":null,"member":false},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "mark pool": '{"phase":"weights \\"loaded\\" \\u00e9","extra":{"pool":[1,2],"pool_bytes":2097152,"pool_why":null},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "mark pool none": '{"phase":"weights \\"loaded\\" \\u00e9","extra":{"pool":null,"pool_bytes":null,"pool_why":"pool unreadable"},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "sample": '{"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    "sample none": '{"device":{"index":null,"uuid":null,"nvml_index":null,"why":null},"torch":{"reserved":null,"allocated":null,"peak_allocated":null,"num_alloc_retries":null,"num_ooms":null,"why":null},"driver":{"free":null,"total":null,"why":null},"nvml":{"self_bytes":null,"procs":null,"why":null},"arenas":{},"derived":{"non_torch":null,"non_torch_measured":false,"unbacked_reservation":null}}',
    "census": '{"round":5,"every":10,"counts":[["dp:0,2","barrier",1],["tp:0-1","all_reduce",4]],"graphs":{"g1":{"counts":[["tp:0-1","all_gather",2]],"replays":7}}}',
    "census none": '{"round":null,"every":null,"counts":[],"graphs":{}}',
    "census_dump": '{"round":5,"every":10,"counts":[["w","send:1",3]],"graphs":{"g":{"counts":[],"replays":null}},"reason":"SIGTERM"}',
    "census_dump none": '{"round":null,"every":null,"counts":[],"graphs":{},"reason":null}',
    "divergence": '{"round":7,"group":"tp:0-1","op":"all_reduce","counts":{"0":5,"1":4},"lagging":[1]}',
    "divergence agree": '{"round":null,"group":"g","op":"op","counts":{},"lagging":[]}',
    "adapter": '{"framework":"vllm","version":"0.6.0","checked_versions":["0.6.0","0.6.1"],"status":"attached","hooks":["a.b","c.d"],"pending":["e"],"failed":null}',
    "adapter failed": '{"framework":"sglang","version":null,"checked_versions":[],"status":"not_attached","hooks":[],"pending":[],"failed":{"hook":"x.y","why":"gone"}}',
    "adapter none": '{"framework":"f","version":null,"checked_versions":[],"status":"detached","hooks":[],"pending":[],"failed":null}',
    "oom": '{"requested":2097152,"torch_free":10,"torch_limit":83886080000,"device":{"index":1,"uuid":"GPU-9","nvml_index":1,"why":null},"allocator":{"reserved":5,"allocated":4,"num_ooms":1,"segments":3,"why":null},"pools":{"large":{"segments":2,"reserved":4,"allocated":3},"private:1,2":{"segments":1,"reserved":1,"allocated":0}},"largest_free_block":1024,"pools_why":null,"driver":{"free":1,"total":2,"why":null},"nvml":{"self_bytes":3,"procs":{"5":6},"why":null},"holders":[{"pid":5,"bytes":6,"comm":"python","start_ticks":77},{"pid":8,"bytes":null,"comm":null,"start_ticks":null}],"phase":"warmup","phase_wall":1700000000.5,"phase_why":null,"capturing":true,"why":null}',
    "oom none": '{"requested":null,"torch_free":null,"torch_limit":null,"device":{"index":null,"uuid":null,"nvml_index":null,"why":null},"allocator":{"reserved":null,"allocated":null,"num_ooms":null,"segments":null,"why":null},"pools":null,"largest_free_block":null,"pools_why":null,"driver":{"free":null,"total":null,"why":null},"nvml":{"self_bytes":null,"procs":null,"why":null},"holders":null,"phase":null,"phase_wall":null,"phase_why":null,"capturing":null,"why":null}',
}

EXPECTED_LINES = [
    '{"v":1,"kind":"census","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"round":5,"every":10,"counts":[["dp:0,2","barrier",1],["tp:0-1","all_reduce",4]],"graphs":{"g1":{"counts":[["tp:0-1","all_gather",2]],"replays":7}}}',
    '{"v":1,"kind":"census","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"round":null,"every":null,"counts":[],"graphs":{}}',
    '{"v":1,"kind":"census_dump","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"round":5,"every":10,"counts":[["w","send:1",3]],"graphs":{"g":{"counts":[],"replays":null}},"reason":"SIGTERM"}',
    '{"v":1,"kind":"census_dump","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"round":null,"every":null,"counts":[],"graphs":{},"reason":null}',
    '{"v":1,"kind":"divergence","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"round":7,"group":"tp:0-1","op":"all_reduce","counts":{"0":5,"1":4},"lagging":[1]}',
    '{"v":1,"kind":"divergence","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"round":null,"group":"g","op":"op","counts":{},"lagging":[]}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"draft","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"weights \\"loaded\\" \\u00e9","extra":{"shards":4,"ratio":0.25,"tags":["a",null,true],"nested":{"k":-1}},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"p","extra":{},"device":{"index":null,"uuid":null,"nvml_index":null,"why":null},"torch":{"reserved":null,"allocated":null,"peak_allocated":null,"num_alloc_retries":null,"num_ooms":null,"why":null},"driver":{"free":null,"total":null,"why":null},"nvml":{"self_bytes":null,"procs":null,"why":null},"arenas":{},"derived":{"non_torch":null,"non_torch_measured":false,"unbacked_reservation":null}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"pre","extra":{},"device":{"index":null,"uuid":null,"nvml_index":null,"why":"CUDA not initialised"},"torch":{"reserved":null,"allocated":null,"peak_allocated":null,"num_alloc_retries":null,"num_ooms":null,"why":"CUDA not initialised"},"driver":{"free":null,"total":null,"why":"CUDA not initialised"},"nvml":{"self_bytes":null,"procs":null,"why":"CUDA not initialised"},"arenas":{},"derived":{"non_torch":null,"non_torch_measured":false,"unbacked_reservation":null}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"weights \\"loaded\\" \\u00e9","extra":{"python":"3.12.1"},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"weights \\"loaded\\" \\u00e9","extra":{"forked":true},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"weights \\"loaded\\" \\u00e9","extra":{"seconds":0.1234567,"group":"world:0","ranks":[0,1,7],"backend":"nccl"},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"weights \\"loaded\\" \\u00e9","extra":{"seconds":null,"group":null,"ranks":null,"backend":null,"member":false},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"weights \\"loaded\\" \\u00e9","extra":{"pool":[1,2],"pool_bytes":2097152,"pool_why":null},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"mark","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"phase":"weights \\"loaded\\" \\u00e9","extra":{"pool":null,"pool_bytes":null,"pool_why":"pool unreadable"},"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"adapter","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"framework":"vllm","version":"0.6.0","checked_versions":["0.6.0","0.6.1"],"status":"attached","hooks":["a.b","c.d"],"pending":["e"],"failed":null}',
    '{"v":1,"kind":"adapter","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"framework":"sglang","version":null,"checked_versions":[],"status":"not_attached","hooks":[],"pending":[],"failed":{"hook":"x.y","why":"gone"}}',
    '{"v":1,"kind":"adapter","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"framework":"f","version":null,"checked_versions":[],"status":"detached","hooks":[],"pending":[],"failed":null}',
    '{"v":1,"kind":"oom","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"requested":2097152,"torch_free":10,"torch_limit":83886080000,"device":{"index":1,"uuid":"GPU-9","nvml_index":1,"why":null},"allocator":{"reserved":5,"allocated":4,"num_ooms":1,"segments":3,"why":null},"pools":{"large":{"segments":2,"reserved":4,"allocated":3},"private:1,2":{"segments":1,"reserved":1,"allocated":0}},"largest_free_block":1024,"pools_why":null,"driver":{"free":1,"total":2,"why":null},"nvml":{"self_bytes":3,"procs":{"5":6},"why":null},"holders":[{"pid":5,"bytes":6,"comm":"python","start_ticks":77},{"pid":8,"bytes":null,"comm":null,"start_ticks":null}],"phase":"warmup","phase_wall":1700000000.5,"phase_why":null,"capturing":true,"why":null}',
    '{"v":1,"kind":"oom","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"requested":null,"torch_free":null,"torch_limit":null,"device":{"index":null,"uuid":null,"nvml_index":null,"why":null},"allocator":{"reserved":null,"allocated":null,"num_ooms":null,"segments":null,"why":null},"pools":null,"largest_free_block":null,"pools_why":null,"driver":{"free":null,"total":null,"why":null},"nvml":{"self_bytes":null,"procs":null,"why":null},"holders":null,"phase":null,"phase_wall":null,"phase_why":null,"capturing":null,"why":null}',
    '{"v":1,"kind":"sample","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"device":{"index":0,"uuid":"GPU-1234","nvml_index":3,"why":null},"torch":{"reserved":536870912,"allocated":314572800,"peak_allocated":471859200,"num_alloc_retries":2,"num_ooms":0,"why":null},"driver":{"free":73400320000,"total":83886080000,"why":null},"nvml":{"self_bytes":1061158912,"procs":{"4242":4613734400,"77":null},"why":null},"arenas":{"kv":{"reserved":100,"backed":40,"retained":7,"why":null},"odd\\n":{"reserved":null,"backed":null,"retained":null,"why":"x"}},"derived":{"non_torch":-524288000,"non_torch_measured":true,"unbacked_reservation":60}}',
    '{"v":1,"kind":"sample","boot":"boot","rank":1,"local_rank":null,"world_size":2,"tp_rank":null,"pp_rank":null,"runner":"target","host":"host","pid":42,"start_ticks":4242,"nspid":[42,1],"pidns":4026531836,"mono":T,"wall":T,"device":{"index":null,"uuid":null,"nvml_index":null,"why":null},"torch":{"reserved":null,"allocated":null,"peak_allocated":null,"num_alloc_retries":null,"num_ooms":null,"why":null},"driver":{"free":null,"total":null,"why":null},"nvml":{"self_bytes":null,"procs":null,"why":null},"arenas":{},"derived":{"non_torch":null,"non_torch_measured":false,"unbacked_reservation":null}}',
]

TIMES = re.compile(r'"mono":[^,]+,"wall":[^,]+')


@pytest.mark.parametrize("name", list(SAMPLES))
def test_each_kind_encodes_to_the_text_written_before(name: str) -> None:
    assert ENCODER.encode(SAMPLES[name].to_json()) == EXPECTED[name]


def test_whole_lines_are_the_lines_written_before(tmp_path: Path) -> None:
    """Header members first (the runner overridden in place), the times, then the body."""
    rank = RankIdentity(rank=1, world_size=2, runner="target")
    process = ProcessIdentity("host", 42, 4242, (42, 1), 4026531836)
    rec = Recorder(flight_dir=tmp_path, boot="boot", rank=rank, process=process)
    for name, body in SAMPLES.items():
        if not name.startswith("header"):
            assert rec.write_record(body, runner="draft" if name == "mark" else None)
    written = [ln for f in sorted(tmp_path.iterdir()) for ln in f.read_text().splitlines()]
    assert [TIMES.sub('"mono":T,"wall":T', ln) for ln in written] == EXPECTED_LINES
    for ln in written:
        times = json.loads(ln)
        assert isinstance(times["mono"], float) and isinstance(times["wall"], float)


# --- every kind parses back what it wrote ---------------------------------------------------

COUNT = st.none() | st.integers(0, MAX_BYTES - 1)
INT = st.none() | st.integers(-(MAX_BYTES - 1), MAX_BYTES - 1)
TEXT = st.none() | st.text(max_size=6)
TIME = st.none() | st.floats(allow_nan=False, allow_infinity=False)
NAMES = st.text(max_size=5)
TEXTS = st.lists(st.text(max_size=4), max_size=3).map(tuple)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4) | TIME,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=6,
)
COUNTS = st.dictionaries(st.tuples(NAMES, NAMES), st.integers(0, 2**60), max_size=3)
GRAPHS = st.dictionaries(NAMES, st.builds(GraphCounts, COUNTS, COUNT), max_size=2)
DEVICE = st.builds(MarkDevice, INT, TEXT, INT, TEXT)
DRIVER = st.builds(MarkDriver, COUNT, COUNT, TEXT)
NVML = st.builds(
    MarkNvml, COUNT, st.none() | st.dictionaries(st.integers(0, 2**31), COUNT, max_size=3), TEXT
)
VIEWS = {
    "device": DEVICE,
    "torch": st.builds(MarkTorch, COUNT, COUNT, COUNT, COUNT, COUNT, TEXT),
    "driver": DRIVER,
    "nvml": NVML,
    "arenas": st.dictionaries(NAMES, st.builds(MarkArena, COUNT, COUNT, COUNT, TEXT), max_size=2),
    "derived": st.builds(
        lambda n, m, u: MarkDerived(n, m and n is not None, u), INT, st.booleans(), INT
    ),
}
HEADER = st.builds(
    Header,
    v=st.integers(),
    kind=st.text(max_size=4),
    boot=st.text(max_size=4),
    host=st.text(max_size=4),
    pid=st.integers(),
    wall=st.floats(allow_nan=False, allow_infinity=False),
    mono=TIME,
    rank=INT,
    local_rank=INT,
    world_size=INT,
    tp_rank=INT,
    pp_rank=INT,
    runner=TEXT,
    start_ticks=INT,
    nspid=st.none() | st.lists(st.integers(), max_size=3).map(tuple),
    pidns=INT,
)
BODIES: dict[str, Any] = {
    "mark": st.builds(Mark, st.text(max_size=6), st.dictionaries(NAMES, JSON, max_size=3), **VIEWS),
    "sample": st.builds(Sample, **VIEWS),
    "census": st.builds(Census, COUNT, COUNT, COUNTS, GRAPHS),
    "census_dump": st.builds(
        CensusDump, reason=TEXT, round=COUNT, every=COUNT, counts=COUNTS, graphs=GRAPHS
    ),
    "census_live": st.builds(
        CensusLive,
        st.dictionaries(st.tuples(NAMES, NAMES), st.integers(0, MAX_BYTES - 1), max_size=3),
        st.none() | st.builds(BlockedIn, TEXT, TEXT, COUNT, TIME),
    ),
    "divergence": st.builds(
        Divergence,
        COUNT,
        st.text(max_size=4),
        st.text(max_size=4),
        st.dictionaries(st.integers(-9, 2**31), st.integers(0, MAX_BYTES - 1), max_size=3),
        st.lists(st.integers(), max_size=3).map(tuple),
    ),
    "adapter": st.builds(
        AdapterStatus,
        framework=st.text(max_size=4),
        version=TEXT,
        checked_versions=TEXTS,
        status=st.text(max_size=4),
        hooks=TEXTS,
        pending=TEXTS,
        failed=st.none() | st.builds(AdapterFailure, TEXT, TEXT),
    ),
    "oom": st.builds(
        Oom,
        COUNT,
        COUNT,
        COUNT,
        DEVICE,
        st.builds(OomAllocator, COUNT, COUNT, COUNT, COUNT, TEXT),
        st.none() | st.dictionaries(NAMES, st.builds(OomPool, COUNT, COUNT, COUNT), max_size=2),
        COUNT,
        TEXT,
        DRIVER,
        NVML,
        st.none() | st.lists(st.builds(OomHolder, st.integers(), COUNT, TEXT, INT), max_size=2),
        TEXT,
        TIME,
        TEXT,
        st.none() | st.booleans(),
        TEXT,
    ),
}
FIELDS: dict[str, Any] = {
    "process_start": st.builds(ProcessStartFields, TEXT) | st.just(ProcessStartFields(forked=True)),
    "group": st.builds(
        GroupFields,
        TIME,
        TEXT,
        st.none() | st.lists(st.integers(), max_size=3),
        TEXT,
        st.none() | st.booleans(),
    ),
    "pool": st.builds(
        PoolFields, st.none() | st.lists(st.integers(), max_size=3).map(tuple), COUNT, TEXT
    ),
}


def through_json(obj: Any) -> Any:
    return json.loads(ENCODER.encode(obj.to_json()))


@pytest.mark.parametrize("kind", list(BODIES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_kind_parses_back_into_what_it_wrote(kind: str, data: st.DataObject) -> None:
    header, body = data.draw(HEADER), data.draw(BODIES[kind])
    bad: list[str] = []
    line = parse_object({**through_json(header), **through_json(body), "kind": kind}, bad)
    assert bad == [] and line is not None
    assert line.body == body
    assert line.header == Header(**{**vars(header), "kind": kind})


@pytest.mark.parametrize("kind", list(BODIES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_writers_encoder_of_a_kind_writes_its_field_driven_json(
    kind: str, data: st.DataObject
) -> None:
    """The line encoder the writer generates from a kind's fields, byte for byte what the
    codec's field-driven to_json encodes to."""
    body = data.draw(BODIES[kind])
    assert "{" + line_encoder(type(body))(body) + "}" == ENCODER.encode(body.to_json())


def test_every_kind_is_drawn_and_none_names_a_header_member() -> None:
    """A line is the header's members, then the body's: a body member of a header's name
    would be merged into the header instead (the writer's line encoder never merges)."""
    assert set(BODIES) == set(KINDS)
    for name, body in SAMPLES.items():
        if not name.startswith("header"):
            assert EXPECTED_HEADER.keys().isdisjoint(body.to_json()), name


@pytest.mark.parametrize("kind", list(FIELDS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_typed_extras_parse_back_into_what_they_wrote(kind: str, data: st.DataObject) -> None:
    fields: MarkFields = data.draw(FIELDS[kind])
    bad: list[str] = []
    assert type(fields).parse(through_json(fields), bad) == fields and bad == []


def test_the_special_wire_shapes_parse_as_before() -> None:
    """What the declaration cannot say alone: a residual measured only with its value, pid
    and rank keys as strings, a holder of no pid, a divergence of no group."""
    bad: list[str] = []
    derived = {"non_torch": None, "non_torch_measured": True}
    line = parse_object({**EXPECTED_HEADER, "phase": "p", "derived": derived}, bad)
    assert line is not None and isinstance(line.body, Mark)
    assert line.body.derived == MarkDerived(None, False, None) and bad == []
    nvml = MarkNvml.parse({"procs": {"7": 1, "x": 2, "8": -1}}, bad)
    assert nvml is not None and nvml.procs == {7: 1, 8: None}
    assert bad == ["mark.nvml.procs", "mark.nvml.procs"]
    bad = []
    oom = Oom.parse({"holders": [{"pid": 3}, {"bytes": 1}, 5], "pools": {"large": 1}}, bad)
    assert oom is not None and oom.holders == [OomHolder(3)]
    assert oom.pools == {"large": OomPool()} and bad == ["oom.holders.pid"]
    div = {"round": 1, "group": "g", "op": "o", "counts": {"0": 1, "1": True}, "lagging": [1]}
    assert Divergence.parse({**div, "group": None}, bad) is None
    assert Divergence.parse(div, bad) == Divergence(1, "g", "o", {0: 1}, (1,))
    assert bad == ["oom.holders.pid", "divergence.counts"]


EXPECTED_HEADER = json.loads(EXPECTED["header"])


def test_a_census_live_line_keeps_its_readable_counts_and_names_the_rest() -> None:
    bad: list[str] = []
    raw = {"changed": {"g": {"op": -1, "ok": 3}, "h": 5}, "blocked_in": {"seq": "x", "op": "ok"}}
    live = CensusLive.parse(raw, bad)
    assert live is not None
    assert live.changed == {("g", "ok"): 3}
    assert live.blocked_in == BlockedIn(None, "ok", None, None)
    assert bad == ["census_live.changed", "census_live.changed", "census_live.blocked_in.seq"]
    assert "blocked_in" not in CensusLive({("g", "ok"): 3}).to_json()  # absent reads as null


def test_an_optional_section_that_is_no_object_is_a_counted_null() -> None:
    bad: list[str] = []
    live = CensusLive.parse({"changed": {}, "blocked_in": 5}, bad)
    assert live is not None and live.blocked_in is None
    assert bad == ["census_live.blocked_in"]
