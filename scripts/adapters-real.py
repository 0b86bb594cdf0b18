#!/usr/bin/env python3
"""The adapters against the REAL framework code, on CPU (run by scripts/adapters-real.sh in a
venv holding the real SGLang or vLLM wheel, installed --no-deps). For one framework:

1. attach: the import hooks, then the adapter's modules imported: every hook attached, and
   the version a checked one (status ``attached``);
2. count: two real processes over gloo, each with a real ``GroupCoordinator``, call its
   collectives; each rank's census is what was called;
3. KV: the arena of a real KV config (vLLM) or a real CPU KV pool (SGLang);
4. compile: the counted ``all_reduce`` under torch.compile (fullgraph=True), over gloo:
   it compiles, its result is the eager one, and the count is printed.

Prints one JSON line per step and exits non-zero when a check fails.

    python scripts/adapters-real.py vllm|sglang
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import socket
import sys
import tempfile
import types
from typing import Any

N_COMPILED = 5


def _emit(step: str, **fields: Any) -> None:
    print(json.dumps({"step": step, **fields}, sort_keys=True), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Unavailable:
    """A torchvision name: importable, raising when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: the torchvision STAND-IN of scripts/adapters-real.py")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """STAND-IN for torchvision, SGLang only: PyPI's torchvision wheels are CUDA builds, which
    do not load beside the CPU torch here, and SGLang imports it at module level (its
    multimodal preprocessing, which this lane never runs)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0+rankscope.standin"

        def attribute(attr: str, prefix: str = spec.name) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Unavailable(f"{prefix}.{attr}")

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _prepare(framework: str) -> None:
    if framework == "sglang" and not any(isinstance(f, _TorchvisionStandIn) for f in sys.meta_path):
        sys.meta_path.append(_TorchvisionStandIn())


def _adapter(framework: str) -> Any:
    from rankscope.rank import adapters

    return next(a for a in adapters.ADAPTERS if a.framework == framework)


def _attach(framework: str) -> Any:
    """Install the hooks and import every module the adapter attaches to."""
    import importlib

    from rankscope.rank import adapters

    _prepare(framework)
    adapter = _adapter(framework)
    adapters.install_import_hooks([adapter])
    for module in adapter.modules():
        importlib.import_module(module)
    return adapter


def _sglang_coordinator(rank: int) -> Any:
    """A TP group over gloo with every device communicator off (each version names its own:
    0.5.22 has use_npu_communicator, 0.5.23 not)."""
    import inspect

    from sglang.srt.distributed import parallel_state as ps

    switches = {
        name: False
        for name, param in inspect.signature(ps.GroupCoordinator.__init__).parameters.items()
        if name.startswith("use_") and param.default is inspect.Parameter.empty
    }
    return ps.GroupCoordinator(
        group_ranks=[[0, 1]],
        local_rank=rank,
        torch_distributed_backend="gloo",
        group_name="tp",
        **switches,
    )


def _vllm_coordinator(rank: int) -> Any:
    from vllm.distributed import parallel_state as ps

    return ps.GroupCoordinator(
        group_ranks=[[0, 1]],
        local_rank=rank,
        torch_distributed_backend="gloo",
        use_device_communicator=True,
        group_name="tp",
    )


def _collectives(framework: str, coordinator: Any, rank: int) -> dict[str, int]:
    """Call the coordinator's collectives as the framework does; what each should count."""
    import torch

    x = torch.ones(4)
    coordinator.all_reduce(x.clone())
    coordinator.all_reduce(x.clone())
    coordinator.broadcast(x.clone(), src=0)
    coordinator.barrier()
    coordinator.broadcast_object({"step": 1} if rank == 0 else None, src=0)
    if rank == 0:
        coordinator.send(x.clone(), dst=1)
    else:
        coordinator.recv(x.shape, x.dtype, src=0)
    peer = "send>1" if rank == 0 else "recv<0"
    return {"all_reduce": 2, "broadcast": 1, "barrier": 1, "broadcast_object": 1, peer: 1}


def _compile_outcome(fn: Any, fullgraph: bool) -> tuple[str, Any]:
    """('ok', the last output) of N compiled calls, or (the error's first line, None)."""
    import torch

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=fullgraph, backend="aot_eager")
    try:
        for _ in range(N_COMPILED):
            out = compiled(torch.ones(4))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", None
    return "ok", out


@contextlib.contextmanager
def _uncounted(cls: type) -> Any:
    """``cls`` with every census-counted method back to the framework's own, for the span."""
    from rankscope.rank.census.wrap import MARK

    counted = {n: m for n, m in vars(cls).items() if getattr(m, MARK, False)}
    for name, method in counted.items():
        setattr(cls, name, method.__wrapped__)
    try:
        yield
    finally:
        for name, method in counted.items():
            setattr(cls, name, method)


def _compiled(coordinator: Any) -> dict[str, Any]:
    """The counted all_reduce compiled, fullgraph on and off, beside the unwrapped method
    compiled the same way: the outcomes must be the same, a compiled result the eager one.
    Counted: the census's all_reduce count over the N compiled calls."""
    import torch

    from rankscope.rank.census import counts

    def wrapped(x: Any) -> Any:
        return coordinator.all_reduce(torch.sin(x)) + 1

    with _uncounted(type(coordinator)):
        eager = wrapped(torch.ones(4))
    result: dict[str, Any] = {"calls": N_COMPILED}
    for fullgraph in (True, False):
        before = counts.snapshot().get(("tp:0-1", "all_reduce"), 0)
        outcome, out = _compile_outcome(wrapped, fullgraph)
        counted = counts.snapshot().get(("tp:0-1", "all_reduce"), 0) - before
        with _uncounted(type(coordinator)):
            plain, _ = _compile_outcome(wrapped, fullgraph)
        same = outcome == plain and (out is None or bool(torch.equal(out, eager)))
        result[f"fullgraph={fullgraph}"] = {
            "wrapped": outcome,
            "unwrapped": plain,
            "counted": counted,
            "as_unwrapped": same,
        }
    result["ok"] = all(v["as_unwrapped"] for k, v in result.items() if k.startswith("full"))
    return result


def _rank(framework: str, rank: int, port: int, queue: Any) -> None:
    try:
        import torch.distributed as dist

        from rankscope.rank.census import counts

        _attach(framework)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
        )
        make = _sglang_coordinator if framework == "sglang" else _vllm_coordinator
        coordinator = make(rank)
        counts.reset()
        expected = _collectives(framework, coordinator, rank)
        got = {op: n for (group, op), n in counts.snapshot().items() if group == "tp:0-1" and n}
        compiled = _compiled(coordinator)
        queue.put({"rank": rank, "expected": expected, "counted": got, "compile": compiled})
        dist.destroy_process_group()
    except BaseException as exc:  # the parent reports it
        queue.put({"rank": rank, "error": repr(exc)})
        raise


def _count_over_gloo(framework: str) -> bool:
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    port = _free_port()
    procs = [spawn.Process(target=_rank, args=(framework, r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(timeout=60)
    ok = True
    for result in results:
        if "error" in result:
            _emit("count", rank=result["rank"], ok=False, error=result["error"])
            ok = False
            continue
        counted_ok = result["counted"] == result["expected"]
        _emit("count", rank=result["rank"], ok=counted_ok, counted=result["counted"])
        _emit("compile", rank=result["rank"], **result["compile"])
        ok = ok and counted_ok and result["compile"]["ok"]
    return ok


def _kv_vllm() -> dict[str, Any]:
    """Two cache groups overlaying one 4 MiB backing allocation (each tensor says its size),
    and a host-resident tensor: the device holds 4 MiB."""
    from vllm.v1 import kv_cache_interface as kv

    from rankscope.rank.adapters import vllm as adapter

    tensors = [
        kv.KVCacheTensor(size=4 << 20, layers=["l0"], layer_stride=2 << 20, block_stride=8192),
        kv.KVCacheTensor(
            size=4 << 20, layers=["l1"], layer_stride=2 << 20, block_stride=8192, offset=2 << 20
        ),
        kv.KVCacheTensor(
            size=1 << 20, layers=["l2"], layer_stride=1 << 20, block_stride=4096, host_resident=True
        ),
    ]
    config = kv.KVCacheConfig(num_blocks=256, kv_cache_tensors=tensors, kv_cache_groups=[])
    arena = adapter.KvCacheArena(adapter.device_kv_bytes(config), None)
    return {
        "class": "KVCacheConfig",
        "reserved": arena.reserved_bytes(),
        "expected": 4 << 20,
        "backed": arena.backed_bytes(),
    }


def _kv_sglang() -> dict[str, Any]:
    import torch
    from sglang.srt.mem_cache import memory_pool as mp

    from rankscope.rank.adapters import sglang as adapter

    pool = mp.MHATokenToKVPool(
        size=1024,
        page_size=1,
        dtype=torch.float16,
        head_num=2,
        head_dim=8,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    arena = adapter.KvPoolArena(pool)
    # K + V of 2 layers x (size + 1 padding slot) tokens x 2 heads x 8 dims x 2 bytes
    expected = 2 * 2 * (1024 + 1) * 2 * 8 * 2
    return {
        "class": "MHATokenToKVPool",
        "reserved": arena.reserved_bytes(),
        "expected": expected,
        "backed": arena.backed_bytes(),
    }


def main() -> int:
    framework = sys.argv[1]
    if "RANKSCOPE_DIR" not in os.environ:  # run by hand: a flight directory of its own
        os.environ["RANKSCOPE_DIR"] = tempfile.mkdtemp(prefix="rankscope-real-")
    adapter = _attach(framework)
    attached = adapter.state == "attached" and not adapter.unverified
    _emit(
        "attach",
        ok=attached,
        framework=framework,
        version=adapter.version,
        state=adapter.state,
        hooks=len(adapter.hooks),
        hook_points=adapter.hooks,
    )
    kv = _kv_sglang() if framework == "sglang" else _kv_vllm()
    kv_ok = kv["reserved"] == kv["expected"] == kv["backed"]
    _emit("kv", ok=kv_ok, **kv)
    counted = _count_over_gloo(framework)
    return 0 if attached and kv_ok and counted else 1


if __name__ == "__main__":
    raise SystemExit(main())
