"""What zero-touch arming costs, as ratios against baselines measured in the same run.

    python3 bench/bench_startup.py [--starts N] [--iterations N] [--rounds N] [--marks-only]
                                   [--out DIR]

- unarmed start-up: ``python -c pass`` (and ``python -c "import torch"``) in a venv whose
  site-packages holds rankscope-auto.pth, nothing armed, against the same venv without it;
  the starts alternate between the two so drift on a shared machine hits both alike.
  Goal: <= 1.02x.
- armed start-up: the same with RANKSCOPE_AUTO=1 and RANKSCOPE_DIR (what an armed process
  pays once: importing rankscope, the process_start mark), for the record.
- armed cost per generic mark, in process, each called as its hook calls it (rankscope.rank.auto)
  against the raw reads it needs plus the write(2) of an equally long line, alternated in
  rounds (median and spread, as bench_mark.py). The raw reads: a mark's base reads (on the
  CPU torch.cuda.is_initialized(); on a GPU the allocator's stats call and NVML's memory info
  and process list through pynvml), plus for nccl_init_end the group queries it records
  (the census's instance name, torch.distributed's get_process_group_ranks and get_backend),
  plus for capture_end (GPU only) the reads that give the graph pool's bytes: the graph's
  pool id, the snapshot of that pool alone (as torch.cuda.MemPool.snapshot takes it; the
  whole allocator's where this torch takes no pool) and the sum of its segments' sizes
  (against the snapshot alone too, the baseline of the runs before 2026-12-04, which left
  out the id read and the sum). process_start reads nothing more than a plain mark. Budget:
  each mark under 100 us; the ratios to those reads and the write made as one sequence, in
  the hook's order, say where its time goes (the
  sum of each part timed alone in its own loop is printed too: parts run hot alone cost
  less than in sequence). On a GPU the lean reads (the NVML calls the mark makes, direct
  into reused structs) are a second, stricter baseline. Timed twice: in hot loops
  (bench_mark.rounds_of), and interleaved, each call timed alone among the other
  candidates' calls (:func:`interleaved_rounds`; the judged figure: a hook never runs twice
  in a row, and in a hot loop any other call beside the mark costs it more than that call
  alone: on the H200 the group queries, 1.1 us alone, put 6 us on the mark after them).
  Each generic mark's own share beyond a plain mark's is printed too: the median over rounds
  of the mark less a plain mark and the reads it adds (signed).
- the automatic census cadence: a world all_reduce on a one-rank gloo group, counted with
  auto_tick against counted without it.

Each figure is the median of repeats. ``--out DIR`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_mark import (
    BUDGET_US,
    gpu_reads,
    line_writer,
    mark_line,
    median,
    ratio_figure,
    rounds_of,
    say_ratio,
    say_time,
)

ROOT = Path(__file__).resolve().parents[1]
PTH = ROOT / "exporter" / "rankscope-auto.pth"


def make_venv(where: Path, with_pth: bool) -> str:
    """A venv seeing this interpreter's packages (torch); with or without the .pth."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python*/site-packages")
    (site / "host-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if with_pth:
        (site / PTH.name).write_bytes(PTH.read_bytes())
    return str(where / "bin" / "python")


def start_seconds(python: str, code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [python, "-c", code],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def startup_ratio(
    plain: str, hooked: str, code: str, env: dict[str, str], hooked_env: dict[str, str], starts: int
) -> dict[str, float]:
    """Start-ups of each, alternating: medians and minima (noise on a shared machine only
    adds time, so the minima are the steadier estimate) and their ratios."""
    a: list[float] = []
    b: list[float] = []
    for i in range(starts):
        order = [(plain, env, a), (hooked, hooked_env, b)]
        for python, e, out in order if i % 2 == 0 else reversed(order):
            out.append(start_seconds(python, code, e))
    return {
        "plain_median_ms": statistics.median(a) * 1e3,
        "hooked_median_ms": statistics.median(b) * 1e3,
        "median_ratio": statistics.median(b) / statistics.median(a),
        "plain_min_ms": min(a) * 1e3,
        "hooked_min_ms": min(b) * 1e3,
        "min_ratio": min(b) / min(a),
        "starts": starts,
    }


def pth_line_ns(iterations: int) -> float:
    """What site.py spends on the .pth's line in an unarmed process: executing it."""
    code = compile(PTH.read_text(), str(PTH), "exec")
    namespace: dict[str, Any] = {}
    return per_call_ns(lambda: exec(code, namespace), iterations)


def per_call_ns(fn: Callable[[], Any], iterations: int, repeats: int = 7) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter_ns() - start) / iterations)
    return statistics.median(samples)


def sequence_of(parts: list[Callable[[], Any]]) -> Callable[[], None]:
    """One call making ``parts`` in order."""

    def sequence() -> None:
        for part in parts:
            part()

    return sequence


def interleaved_rounds(
    candidates: dict[str, Callable[[], Any]], calls: int, rounds: int
) -> dict[str, list[float]]:
    """ns per call of each candidate, the candidates called in turn, one call each, each
    call timed alone; the order is shuffled at every turn (seeded), so each candidate
    follows every other alike. A round's figure is the median of its ``calls`` calls.

    Unlike a hot loop, no call runs right after a call of its own (a hook fires once per
    group or capture, never twice in a row), and a slow spell of the machine lands on every
    candidate alike instead of on the ones whose loop it overlapped."""
    clock = time.perf_counter_ns
    names = list(candidates)
    fns = [candidates[name] for name in names]
    order = list(range(len(fns)))
    shuffle = random.Random(0).shuffle
    for _ in range(max(calls // 10, 1)):  # warm lazy initialisation
        for fn in fns:
            fn()
    out: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        times: list[list[int]] = [[] for _ in names]
        for _ in range(calls):
            shuffle(order)
            for j in order:
                fn = fns[j]
                start = clock()
                fn()
                times[j].append(clock() - start)
        for name, taken in zip(names, times, strict=True):
            out[name].append(statistics.median(taken))
    return out


def in_process(iterations: int, rounds: int, results: dict[str, Any]) -> None:
    """The generic marks, each through the hook's own call (rankscope.rank.auto), against the raw
    reads it needs plus the write, alternated in rounds (bench_mark.rounds_of)."""
    import torch
    import torch.distributed as dist

    from rankscope.rank import auto, census, probe
    from rankscope.rank.census import snapshots, torch_patch
    from rankscope.rank.writer import RECORDER

    with tempfile.TemporaryDirectory() as tmp:
        RECORDER.configure(flight_dir=tmp)
        gpu = torch.cuda.is_available()
        if gpu:
            torch.cuda.set_device(0)
            hold = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            base_reads, lean_reads, where = gpu_reads()
        else:
            cuda = torch.cuda

            def base_reads() -> None:
                cuda.is_initialized()

            lean_reads, where = None, "CPU (CUDA never initialised)"
        write = line_writer(tmp, mark_line())  # on a GPU, a line with the card's numbers
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=0, world_size=1)
        world = dist.GroupMember.WORLD

        def group_queries() -> None:
            # what nccl_init_end reads beyond a plain mark (auto._group_fields)
            torch_patch._instance_of(dist, None)
            list(dist.get_process_group_ranks(world))
            str(dist.get_backend(None))

        candidates: dict[str, Any] = {
            "plain_mark": lambda: probe.mark("weights_loaded"),
            "process_start": auto._mark_process_start,
            # as the new_group hook calls it, for the world group
            "nccl_init_end": lambda: auto._group_end(dist, ((), {}), world, 0.1),
            "base_reads": base_reads,
            "group_queries": group_queries,
            "write": write,
        }
        if lean_reads is not None:
            candidates["lean_reads"] = lean_reads
        # each generic mark: (what it adds to the base reads and the write)
        needs: dict[str, list[str]] = {
            "plain_mark": [],
            "process_start": [],
            "nccl_init_end": ["group_queries"],
        }
        if gpu:
            graph = torch.cuda.CUDAGraph()
            x = torch.zeros(1024, device="cuda")
            with torch.cuda.graph(graph):
                y = x * 2  # an allocation in the graph's pool, which capture_end then sums
            pool = tuple(graph.pool())
            fields = auto.pool_fields(torch, graph)
            print(f"capture_end's pool fields: {fields}")
            assert fields.pool_bytes, fields
            form = auto._pool_form
            snapshot = torch._C._cuda_memorySnapshot
            if form in auto.POOL_SNAPSHOT_FORMS:
                argument = pool + form

                def snapshot_read() -> None:
                    snapshot(argument)["segments"]

                def pool_read() -> None:
                    # the reads that give the pool's bytes: its id, its snapshot, the sum
                    held = 0
                    for segment in snapshot(graph.pool() + form)["segments"]:
                        held += segment["total_size"]
            else:  # this torch takes no pool: the whole snapshot is the read

                def snapshot_read() -> None:
                    torch.cuda.memory._snapshot()

                def pool_read() -> None:
                    auto.pool_bytes(torch.cuda.memory._snapshot()["segments"], graph.pool())

            candidates["capture_end"] = lambda: auto._mark_capture_end(torch, graph)
            results["capture_end_pool_fields"] = fields.to_json()
            candidates["pool_read"] = pool_read
            candidates["pool_snapshot"] = snapshot_read
            candidates["whole_snapshot"] = lambda: torch.cuda.memory._snapshot()
            needs["capture_end"] = ["pool_read"]
        # Judged against each mark's raw sequence; also printed against these (the
        # baseline of the runs before 2026-12-04 for capture_end: the pool's snapshot
        # alone, without the id read or the sum).
        also: dict[str, list[str]] = {"capture_end": ["pool_snapshot"]} if gpu else {}
        # Each mark's raw reads and write also as one sequence, in the hook's order (its own
        # reads, then a mark's): parts timed alone in hot loops cost less than the same parts
        # in sequence (on the H200, 46.7 against 48.5 us for capture_end's), and the mark
        # makes them in sequence.
        for name, extra_reads in needs.items():
            candidates[f"{name}_raw_sequence"] = sequence_of(
                [candidates[r] for r in (*extra_reads, "base_reads", "write")]
            )
        for name, extra_reads in also.items():
            candidates[f"{name}_other_raw_sequence"] = sequence_of(
                [candidates[r] for r in (*extra_reads, "base_reads", "write")]
            )
        per_round = rounds_of(candidates, iterations, rounds)
        compared = [
            *needs,
            *(f"{name}_raw_sequence" for name in needs),
            *(f"{name}_other_raw_sequence" for name in also),
        ]
        per_call = interleaved_rounds({n: candidates[n] for n in compared}, iterations, rounds)
        if gpu:
            del hold, y
        results["generic_marks"] = {"where": where, "ns": per_round, "ratios": {}}
        print(f"armed generic marks on the {where} ({rounds} alternated rounds)")
        for name in [*candidates]:
            say_time(name.replace("_", " "), median(per_round, name))
        for name, extra_reads in needs.items():
            figure = ratio_figure(per_round, name, f"{name}_raw_sequence")
            results["generic_marks"]["ratios"][f"{name} / its raw reads + write, in sequence"] = (
                figure
            )
            say_ratio(f"{name} / its raw reads + write, in sequence", figure)
            raw = ["base_reads", *extra_reads, "write"]
            figure = ratio_figure(per_round, name, raw)
            results["generic_marks"]["ratios"][f"{name} / raw reads + write"] = figure
            say_ratio(f"{name} / ({' + '.join(raw)})", figure)
            if name != "plain_mark":
                # its own work beyond a plain mark's: the mark less a plain mark and the reads
                # it adds, per round (the rounds alternate, so drift hits all alike)
                own = statistics.median(
                    mark - plain - sum(per_round[r][i] for r in extra_reads)
                    for i, (mark, plain) in enumerate(
                        zip(per_round[name], per_round["plain_mark"], strict=True)
                    )
                )
                results["generic_marks"].setdefault("own_beyond_plain_ns", {})[name] = own
                say_time(f"{name}: own share beyond a plain mark", own)
            if lean_reads is not None:
                lean = ["lean_reads", *extra_reads, "write"]
                figure = ratio_figure(per_round, name, lean)
                results["generic_marks"]["ratios"][f"{name} / lean reads + write"] = figure
                say_ratio(f"{name} / ({' + '.join(lean)})", figure)

        results["generic_marks_interleaved"] = {"ns": per_call, "ratios": {}}
        print(
            f"the same, interleaved: each call timed alone, the candidates in a shuffled turn "
            f"(median of {iterations} calls a round, {rounds} rounds)"
        )
        for name in compared:
            say_time(name.replace("_", " "), median(per_call, name))
        for name in needs:
            figure = ratio_figure(per_call, name, f"{name}_raw_sequence")
            results["generic_marks_interleaved"]["ratios"][name] = figure
            say_ratio(f"{name} / its raw reads + write, in sequence", figure)
            mark_us = median(per_call, name) / 1000
            print(f"  {name} under {BUDGET_US} us: {'met' if mark_us < BUDGET_US else 'MISSED'}")
        for name, extra_reads in also.items():
            figure = ratio_figure(per_call, name, f"{name}_other_raw_sequence")
            label = f"{name} / ({' + '.join(['base_reads', *extra_reads, 'write'])})"
            results["generic_marks_interleaved"]["ratios"][label] = figure
            say_ratio(label, figure)

        # The automatic cadence on the hot path: what auto_tick adds to a counted world
        # collective (snapshots off: every is huge), against the collective itself.
        census.configure(auto_every=10**9)
        tick = per_call_ns(snapshots.auto_tick, iterations * 50)
        t = torch.ones(4)
        collective = min(per_call_ns(lambda: dist.all_reduce(t), iterations) for _ in range(3))
        results["auto_tick_ns"] = tick
        results["all_reduce_us"] = collective / 1000
        print(
            f"auto_tick per world collective: {tick:.0f} ns ({tick / collective:.2%} of a "
            f"1-rank gloo all_reduce, {collective / 1000:.1f} us)"
        )
        dist.destroy_process_group()
        RECORDER.configure()
        RECORDER.flight_dir = None
        RECORDER.armed = False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=60, help="start-ups of each kind")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9, help="alternated rounds a mark figure")
    parser.add_argument("--marks-only", action="store_true", help="skip the start-up figures")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    if not args.marks_only:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
        env["PYTHONPATH"] = str(ROOT / "exporter")
        with tempfile.TemporaryDirectory() as tmp:
            plain = make_venv(Path(tmp) / "plain", with_pth=False)
            hooked = make_venv(Path(tmp) / "hooked", with_pth=True)
            armed_env = {**env, "RANKSCOPE_AUTO": "1", "RANKSCOPE_DIR": str(Path(tmp) / "flight")}
            for label, code, starts in (
                ("python -c pass", "pass", args.starts),
                ("python -c 'import torch'", "import torch", max(args.starts // 10, 3)),
            ):
                unarmed = startup_ratio(plain, hooked, code, env, env, starts)
                armed = startup_ratio(plain, hooked, code, env, armed_env, starts)
                key = "startup_" + ("pass" if code == "pass" else "torch")
                results[key] = {"unarmed": unarmed, "armed": armed}
                print(
                    f"{label:<26} [{starts} starts each] without the .pth "
                    f"{unarmed['plain_median_ms']:.1f} ms (min {unarmed['plain_min_ms']:.1f}); "
                    f"with it, unarmed: {unarmed['median_ratio']:.3f}x median, "
                    f"{unarmed['min_ratio']:.3f}x min; armed: {armed['median_ratio']:.2f}x median"
                )
        line = pth_line_ns(args.iterations * 50)
        results["pth_line_unarmed_ns"] = line
        base = results["startup_pass"]["unarmed"]["plain_min_ms"] * 1e6
        print(
            f"the .pth line, unarmed, in process: {line:.0f} ns ({line / base:.6f} of the "
            "fastest bare start-up)"
        )
    in_process(args.iterations, args.rounds, results)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_startup.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
