"""Counted methods under torch.compile (CPU here; the gpu-marked variant compiles CUDA
tensors with inductor): a wrapped collective-shaped method compiles as it would unwrapped
(one graph, no break, fullgraph on or off), and is counted once per call, not per trace.

The coordinator here is a stand-in class of the shape of SGLang's and vLLM's
GroupCoordinator; its "collective" is arithmetic (no process group is needed to trace).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rankscope.rank import census
from rankscope.rank.census import counts

torch = pytest.importorskip("torch")
dynamo_testing = pytest.importorskip("torch._dynamo.testing")

N = 7
KEY = ("tp:0-1", "all_reduce")


class Coordinator:
    """GroupCoordinator-shaped: unique_name, ranks, and a traceable collective."""

    unique_name = "tp:0"
    ranks = (0, 1)
    world_size = 2
    rank_in_group = 0

    def all_reduce(self, x: Any) -> Any:
        return x * 2


@pytest.fixture
def counted() -> Iterator[Coordinator]:
    undo = census.instrument_methods(Coordinator, {"all_reduce": "all_reduce"})
    counts.reset()
    torch._dynamo.reset()
    yield Coordinator()
    undo()
    counts.reset()
    torch._dynamo.reset()


def _model(coordinator: Coordinator) -> Any:
    def model(x: Any) -> Any:
        return coordinator.all_reduce(torch.sin(x)) + 1

    return model


def _frames(model: Any, fullgraph: bool, backend: str = "aot_eager") -> tuple[Any, int | None]:
    """Compile ``model`` through dynamo's counting backend (AOTAutograd is what drops an op
    with no output, so it runs behind the counter), call it N times: (the counter, the
    count then)."""
    counter = dynamo_testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(model, fullgraph=fullgraph, backend=counter)
    x = torch.ones(4)
    for _ in range(N):
        out = compiled(x)
    counted = counts.snapshot().get(KEY)
    assert torch.equal(out, model(x))
    return counter, counted


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_counted_method_is_counted_per_call_in_one_graph(counted, fullgraph, backend):
    counter, calls = _frames(_model(counted), fullgraph, backend)
    assert counter.frame_count == 1  # one graph: no graph break, no recompile
    assert calls == N


def test_the_wrapped_method_compiles_to_the_graph_of_the_unwrapped_one_plus_the_count():
    torch._dynamo.reset()
    plain, _ = _frames(_model(Coordinator()), fullgraph=True)
    undo = census.instrument_methods(Coordinator, {"all_reduce": "all_reduce"})
    try:
        torch._dynamo.reset()
        counts.reset()
        wrapped, calls = _frames(_model(Coordinator()), fullgraph=True)
    finally:
        undo()
        torch._dynamo.reset()
    assert (wrapped.frame_count, wrapped.op_count) == (plain.frame_count, plain.op_count + 1)
    assert calls == N


@pytest.fixture
def opaque_op() -> Iterator[Any]:
    """A custom op of the framework's kind (SGLang's inplace_all_reduce): opaque to dynamo, it
    looks the coordinator up and calls its private method when the graph runs."""
    registry: dict[str, Coordinator] = {}

    @torch.library.custom_op("rankscope_test::inplace_all_reduce", mutates_args=["x"])
    def inplace_all_reduce(x: torch.Tensor, group_name: str) -> None:
        registry[group_name]._all_reduce_in_place(x)

    yield registry, inplace_all_reduce


def test_a_public_method_reaching_a_counted_private_one_through_a_custom_op_counts_once(
    opaque_op,
):
    registry, inplace_all_reduce = opaque_op

    class Sglangish(Coordinator):
        def all_reduce(self, x: Any) -> Any:
            if torch.compiler.is_compiling():
                inplace_all_reduce(x, self.unique_name)
                return x
            self._all_reduce_in_place(x)
            return x

        def _all_reduce_in_place(self, x: Any) -> None:
            x.mul_(2)

    undo = census.instrument_methods(
        Sglangish,
        {"all_reduce": "all_reduce", "_all_reduce_in_place": "all_reduce"},
        eager_only=("all_reduce",),
    )
    coordinator = Sglangish()
    registry[coordinator.unique_name] = coordinator
    try:
        torch._dynamo.reset()
        counts.reset()
        compiled = torch.compile(
            lambda x: coordinator.all_reduce(torch.sin(x)), fullgraph=True, backend="aot_eager"
        )
        for _ in range(N):
            compiled(torch.ones(4))
        assert counts.snapshot()[KEY] == N  # the private method, once per call
        coordinator.all_reduce(torch.ones(4))  # eager: the public method, once
        assert counts.snapshot()[KEY] == N + 1
    finally:
        undo()
        counts.reset()
        torch._dynamo.reset()


def test_a_call_that_raises_is_not_counted(counted):
    class Failing(Coordinator):
        def barrier(self) -> None:
            raise RuntimeError("peer gone")

    undo = census.instrument_methods(Failing, ["barrier"])
    try:
        with pytest.raises(RuntimeError, match="peer gone"):
            Failing().barrier()
        counted.all_reduce(torch.ones(1))
    finally:
        undo()
    assert counts.snapshot() == {KEY: 1, ("tp:0-1", "barrier"): 0}


@pytest.mark.gpu
@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_counted_method_on_cuda_with_inductor_is_counted_per_call(counted, fullgraph):
    compiled = torch.compile(_model(counted), fullgraph=fullgraph, backend="inductor")
    x = torch.ones(4, device="cuda")
    for _ in range(N):
        compiled(x)
    torch.cuda.synchronize()
    assert counts.snapshot()[KEY] == N


@pytest.mark.parametrize("fullgraph", [False, True])
def test_one_compiled_function_over_coordinators_of_other_sizes_counts_each_group(fullgraph):
    """The same compiled code over coordinators whose ranks and sizes differ: dynamo
    recompiles per coordinator (an int that differs between traces turns symbolic, which no
    constant may hold), and each call counts under its own group."""

    class Sized(Coordinator):
        def __init__(self, name: str, ranks: list[int]) -> None:
            self.unique_name, self.ranks, self.world_size = name, ranks, len(ranks)

    undo = census.instrument_methods(Sized, {"all_reduce": "all_reduce"})
    groups = [Sized("tp:0", [0, 1]), Sized("ep:0", [0, 1, 2, 3]), Sized("dp:0", [0, 1, 2])]
    counts.reset()
    torch._dynamo.reset()
    try:
        compiled = torch.compile(
            lambda c, x: c.all_reduce(x + 1), fullgraph=fullgraph, backend="aot_eager"
        )
        for _ in range(N):
            for group in groups:
                compiled(group, torch.ones(2))
    finally:
        undo()
        torch._dynamo.reset()
    assert counts.snapshot() == {
        ("tp:0-1", "all_reduce"): N,
        ("ep:0-3", "all_reduce"): N,
        ("dp:0-2", "all_reduce"): N,
    }


def test_a_coordinator_whose_group_cannot_be_named_compiles_uncounted():
    """A traced call whose group_of fails: the method compiles in one graph, uncounted, and
    the failure is counted."""

    class Nameless:
        def all_reduce(self, x: Any) -> Any:
            return x * 2

    def unnamed(coordinator: Any) -> str:
        return str(coordinator.name)  # no such field: raises when the group is named

    undo = census.instrument_methods(Nameless, {"all_reduce": "all_reduce"}, group_of=unnamed)
    counts.reset()
    torch._dynamo.reset()
    model = _model(Nameless())  # type: ignore[arg-type]
    try:
        counter = dynamo_testing.CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, fullgraph=True, backend=counter)
        failed = counts.failures
        for _ in range(N):
            out = compiled(torch.ones(4))
        traced_failures = counts.failures - failed  # before an eager call can fail too
        assert torch.equal(out, model(torch.ones(4)))
    finally:
        undo()
        torch._dynamo.reset()
    assert counter.frame_count == 1 and counts.snapshot() == {}
    assert traced_failures > 0


def test_a_compiled_torch_distributed_call_compiles_and_is_not_counted(tmp_path):
    """instrument_torch_distributed under torch.compile (fullgraph, one real gloo rank):
    dynamo turns the call into torch's functional collective, so it compiles and counts
    nothing (docs/integrations.md); the eager call is counted."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    undo = census.instrument_torch_distributed()
    try:
        torch._dynamo.reset()
        counts.reset()

        def step(x: Any) -> Any:
            y = torch.sin(x)
            dist.all_reduce(y)
            return y + 1

        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        for _ in range(N):
            out = compiled(torch.ones(4))
        assert counts.snapshot() == {}
        assert torch.equal(out, step(torch.ones(4)))
        assert sum(counts.snapshot().values()) == 1
    finally:
        undo()
        dist.destroy_process_group()
        counts.reset()
        torch._dynamo.reset()


def test_wrapping_in_a_process_that_never_compiles_imports_no_dynamo():
    """Registering the count op pulls in dynamo, which now and then aborted a process that
    never compiles at its exit (gloo ranks of the stand-in boot, about 1 exit in 8): a
    process without torch._dynamo wraps without it."""
    program = (
        "import sys, torch\n"
        "from rankscope.rank import census\n"
        "class Coordinator:\n"
        "    unique_name, ranks = 'tp:0', (0, 1)\n"
        "    def all_reduce(self, x):\n"
        "        return x\n"
        "census.instrument_methods(Coordinator, {'all_reduce': 'all_reduce'})\n"
        "Coordinator().all_reduce(1)\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_a_method_wrapped_before_dynamo_is_imported_counts_its_compiled_calls():
    """The count op is registered when torch._dynamo is imported, after the wrap: compiled
    with fullgraph (aot_eager and inductor), the method counts once per call."""
    program = (
        "import sys, torch\n"
        "from rankscope.rank import census\n"
        "from rankscope.rank.census import counts\n"
        "class Coordinator:\n"
        "    unique_name, ranks, world_size = 'tp:0', [0, 1], 2\n"
        "    def all_reduce(self, x):\n"
        "        return x * 2\n"
        "census.instrument_methods(Coordinator, {'all_reduce': 'all_reduce'})\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "c = Coordinator()\n"
        "for backend in ('aot_eager', 'inductor'):\n"
        "    f = torch.compile(lambda x: c.all_reduce(x + 1), fullgraph=True, backend=backend)\n"
        f"    for _ in range({N}):\n"
        "        f(torch.ones(2))\n"
        "    torch._dynamo.reset()\n"
        "print(counts.snapshot())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=600, check=True
    )
    assert done.stdout.strip() == str({KEY: 2 * N}), done.stderr[-2000:]
