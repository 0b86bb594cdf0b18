"""The card side (sampler, holdings reader, their collectors) end to end on its threads: a
300 ms trough between two collector reads with the sampler at 100 ms, the exposition checked
by promtool and against the catalog, the JSON body of /api/v1/cards, the flags, and NVML
missing. The gpu tests compare with nvidia-smi and drive a real trough with a torch
subprocess."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from rankscope import catalog
from rankscope.daemon import cli
from rankscope.daemon.app import cards_document
from rankscope.daemon.collectors import COLLECTORS
from rankscope.daemon.config import CardsSection, DaemonConfig, FlightSection
from rankscope.daemon.devices import DeviceSource, NvmlSource, ScriptedSource, write_script
from rankscope.daemon.flags import parse_duration
from rankscope.daemon.registry import Collector, TimedCollectors
from rankscope.daemon.sampler import Sampler, parse_floors
from rankscope.daemon.sources import Sources
from support.waiting import wait_for

GiB = 1 << 30
MiB = 1 << 20
CARD_METRICS = {m.name for m in catalog.CATALOG if m.collector in ("cards", "holdings")}


def card(index: int = 0, free: int = 40 * GiB, **extra: Any) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-sim-{index}", "model": "Simulated H200",
            "total": 80 * GiB, "free": free, **extra}  # fmt: skip


@dataclass
class CardSide:
    """The card side of a daemon over one device source: its sources, and the collectors
    the daemon builds on them (cards and holdings by default)."""

    sources: Sources
    collectors: list[Collector]

    @property
    def sampler(self) -> Sampler:
        return self.sources.sampler()

    def ready(self) -> bool:
        return self.sampler.tried.is_set()

    def cards_json(self) -> dict[str, Any]:
        return cards_document(self.sampler)

    def up(self) -> dict[str, bool]:
        return self.sources.up()

    def start(self) -> None:
        self.sources.start()

    def stop(self) -> None:
        self.sources.stop()


def card_side(
    device: DeviceSource,
    flight_dir: Path | None = None,
    names: tuple[str, ...] = ("cards", "holdings"),
    **cards: Any,
) -> CardSide:
    """``cards``: CardsSection's fields; the ranks are those of ``flight_dir`` (none without)."""
    flight = FlightSection(flight_dir or Path("/nonexistent/flight"))
    config = DaemonConfig(flight, cards=CardsSection(**cards))
    sources = Sources(config, device)
    return CardSide(sources, [m.build(config, sources) for m in COLLECTORS if m.NAME in names])


def scrape(side: CardSide) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Collector read -> {sample name: {sorted labels: value}}, through the text format."""
    text = generate_latest(TimedCollectors(side.collectors).registry()).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(samples: dict[str, dict[Any, float]], name: str, gpu: str = "0") -> float:
    [value] = [v for labels, v in samples[name].items() if ("gpu", gpu) in labels]
    return value


@pytest.fixture
def running() -> Iterator[Callable[..., CardSide]]:
    started: list[CardSide] = []

    def start(*args: Any, **kw: Any) -> CardSide:
        m = card_side(*args, **kw)
        m.start()
        started.append(m)
        return m

    yield start
    for m in started:
        m.stop()


def test_a_300ms_trough_between_two_reads_shows_in_free_min_and_the_breach_counter(
    tmp_path: Path, running: Callable[..., CardSide]
) -> None:
    script = tmp_path / "cards.json"
    write_script(script, [card(0, free=40 * GiB), card(1, free=50 * GiB)])
    m = running(ScriptedSource(script), None, floors=parse_floors("10GiB"), interval=0.1)
    wait_for(m.ready)
    before = wait_for(lambda: (s := scrape(m)).get("rankscope_gpu_free_bytes") and s)
    assert one(before, "rankscope_gpu_free_min_bytes") == 40 * GiB
    assert one(before, "rankscope_corridor_breaches_total") == 0

    write_script(script, [card(0, free=4 * GiB), card(1, free=50 * GiB)])
    time.sleep(0.3)
    write_script(script, [card(0, free=40 * GiB), card(1, free=50 * GiB)])
    wait_for(lambda: m.cards_json()["cards"][0]["free"] == 40 * GiB)

    after = scrape(m)
    assert one(after, "rankscope_gpu_free_bytes") == 40 * GiB  # the latest value hides it
    assert one(after, "rankscope_gpu_free_min_bytes") == 4 * GiB  # the minimum does not
    assert one(after, "rankscope_corridor_breaches_total") == 1
    assert 0.05 < one(after, "rankscope_corridor_breach_seconds_total") < 0.6
    assert one(after, "rankscope_gpu_free_min_bytes", "1") == 50 * GiB  # the other card
    assert one(after, "rankscope_corridor_breaches_total", "1") == 0
    assert after["rankscope_sampler_duration_seconds_count"][()] >= 5
    [c0, _] = m.cards_json()["cards"]
    assert (c0["free_min"], c0["floor"], c0["margin"]) == (4 * GiB, 10 * GiB, -6 * GiB)


def test_exposition_passes_promtool_and_matches_the_catalog(
    tmp_path: Path, running: Callable[..., CardSide]
) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        procs = {str(sleeper.pid): 2 * GiB, **{str(4_000_000 + i): i * MiB for i in range(1, 40)}}
        script = tmp_path / "cards.json"
        write_script(script, [card(0, processes=procs), card(1, fail="GPU is lost")])
        m = running(ScriptedSource(script), None, floors=parse_floors("1GiB"), max_per_card=8,
                    holdings_interval=0.05)  # fmt: skip
        wait_for(lambda: m.cards_json()["cards"] and m.cards_json()["cards"][0]["processes"])
        registry = TimedCollectors(m.collectors).registry()
        text = generate_latest(registry).decode()
    finally:
        sleeper.kill()
        sleeper.wait()

    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) is required"
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), (
        check.stdout + check.stderr
    )

    families = {f.name: f for f in text_string_to_metric_families(text)}
    exposed = {catalog.BY_SAMPLE.get(s.name) for f in families.values() for s in f.samples}
    assert None not in exposed, "a sample without a catalog entry"
    assert {m.name for m in exposed if m is not None and m.collector != "self"} == CARD_METRICS
    for fam in families.values():
        for s in fam.samples:
            entry = catalog.BY_SAMPLE.get(s.name)
            assert entry is not None
            assert set(s.labels) <= set(entry.labels) | {"quantile"}, s

    held = [s for s in families["rankscope_gpu_process_bytes"].samples if s.labels["gpu"] == "0"]
    assert len(held) == 8  # the cap: 7 largest and one overflow
    overflow = [s for s in held if s.labels["role"] == "overflow"]
    # kept: the sleeper and 39..34 MiB; the overflow sums 1..33 MiB
    assert [s.value for s in overflow] == [sum(range(1, 34)) * MiB]
    [top] = [s for s in held if s.labels["pid"] == str(sleeper.pid)]
    assert (top.labels["comm"], top.labels["role"], top.value) == ("sleep", "foreign", 2 * GiB)
    # One series per card names its largest foreign holder (none for the card that failed).
    [largest] = families["rankscope_gpu_largest_foreign_bytes"].samples
    assert (largest.labels["gpu"], largest.labels["pid"], largest.labels["comm"]) == (
        "0",
        str(sleeper.pid),
        "sleep",
    )
    assert largest.value == 2 * GiB
    errors = families["rankscope_device_errors"].samples
    assert any(s.labels["gpu"] == "1" and s.value >= 1 for s in errors)

    om = generate_openmetrics(registry).decode()
    om_families = {f.name for f in parse_om(om)}
    assert om_families == {catalog.BY_NAME[name].family for name in CARD_METRICS} | {
        "rankscope_sampler_duration_seconds", "rankscope_sampler_overruns",
        "rankscope_collector_success", "rankscope_collector_duration_seconds",
    }  # fmt: skip


def test_cards_json_has_the_documented_shape(
    tmp_path: Path, running: Callable[..., CardSide]
) -> None:
    script = tmp_path / "cards.json"
    write_script(script, [card(0, free=30 * GiB, processes={str(os.getpid()): GiB})])
    m = running(ScriptedSource(script), None, holdings_interval=0.05)
    [c] = wait_for(lambda: (cs := m.cards_json()["cards"]) and cs[0]["processes"] and cs)
    assert set(c) == {
        "gpu", "uuid", "model", "source", "total", "free", "free_min", "floor", "margin",
        "breach_seconds", "breaches", "rank_resident", "foreign", "unattributed", "processes",
        "last_oom",
    }  # fmt: skip
    assert c["last_oom"] is None  # no OOM book here
    assert (c["gpu"], c["uuid"], c["source"], c["total"]) == (0, "GPU-sim-0", "simulated", 80 * GiB)
    assert c["floor"] is None and c["margin"] is None and c["breaches"] is None  # no floor
    assert c["processes"] == [
        {"pid": os.getpid(), "comm": Path("/proc/self/comm").read_text().strip(), "bytes": GiB,
         "role": "foreign", "boot": None, "rank": None}
    ]  # fmt: skip
    assert m.up() == {"simulated": True}
    json.dumps(m.cards_json())  # serialisable as it stands


def test_without_nvml_the_source_is_down_and_the_collectors_still_answer() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine; this test is for machines without it")
    except Exception:
        pass
    m = card_side(NvmlSource(), interval=0.05)
    m.start()
    try:
        wait_for(m.ready)
        assert m.up() == {"nvml": False}
        doc = m.cards_json()
        assert doc["cards"] == [] and doc["why"].startswith("device source nvml is down: ")
        samples = scrape(m)
        errors = samples["rankscope_device_errors_total"]
        assert errors[(("gpu", ""), ("source", "nvml"), ("uuid", ""))] >= 1
        assert set(samples["rankscope_collector_success"].values()) == {1.0}
        assert "NVML" in (m.sampler.source_failing or "")
    finally:
        m.stop()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rankscope serve")
    cli.configure_parser(p, "serve")
    return p.parse_args(["--flight.dir=/nonexistent/flight", *argv])


def sampler_of(args: argparse.Namespace) -> Sampler:
    return Sources(cli.config_from_args(args)).sampler()


def test_flags(tmp_path: Path) -> None:
    args = parse([])
    assert (args.sampler_interval, args.sampler_window, args.holdings_interval) == (0.1, 15.0, 1.0)
    assert (args.device_source, args.holdings_max_per_card) == ("auto", 32)
    args = parse(["--corridor.floor=2GiB", "--corridor.floor=0=3GiB,GPU-x=5%",
                  "--sampler.interval=250ms", "--sampler.window=1m30s",
                  f"--device.script={tmp_path / 'c.json'}"])  # fmt: skip
    sampler = sampler_of(args)
    assert isinstance(sampler.source, ScriptedSource)
    assert (sampler.interval, sampler.window) == (0.25, 90.0)
    floors = sampler.floors
    assert floors.by_card[""].bytes == 2 * GiB
    assert floors.by_card["0"].bytes == 3 * GiB and floors.by_card["GPU-x"].fraction == 0.05
    assert isinstance(sampler_of(parse([])).source, NvmlSource)
    with pytest.raises(ValueError, match=r"--device\.script"):
        sampler_of(parse(["--device.source=script"]))
    daemon = cli.build(parse(["--no-collector.holdings"]))
    assert "cards" in {c.name for c in daemon.collectors.collectors}
    assert "holdings" not in {c.name for c in daemon.collectors.collectors}
    assert daemon.sources.holdings_reader is None


@pytest.mark.parametrize(
    "argv",
    [["--corridor.floor=lots"], ["--sampler.interval=0s"], ["--sampler.window=15"],
     ["--holdings.max-per-card=0"], ["--device.source=magic"]],
)  # fmt: skip
def test_bad_flags_are_refused_with_the_flag_named(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(argv)
    assert argv[0].split("=")[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"), [("100ms", 0.1), ("15s", 15), ("1m30s", 90), ("0.5s", 0.5)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


# --- on a real GPU ------------------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import ctypes, sys, time
    from pathlib import Path
    import torch
    from rankscope.rank.writer import RankIdentity, Recorder
    from rankscope.record import Mark
    ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)  # PR_SET_NAME
    torch.ones(1, device="cuda:0")  # the CUDA context
    if sys.argv[2]:  # a flight dir: this process is a rank
        rec = Recorder(flight_dir=Path(sys.argv[2]), boot="gpu-boot", rank=RankIdentity(rank=0))
        assert rec.write_record(Mark("boot_complete"))
    keep = torch.empty(int(sys.argv[3]), dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "spike":
            spike = torch.empty(int(sys.argv[4]), dtype=torch.uint8, device="cuda:0")
            torch.cuda.synchronize()
            time.sleep(0.3)
            del spike
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            print("done", flush=True)
    """
)


def start_holder(
    comm: str, flight_dir: Path | None, hold: int, spike: int = 0
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, comm, str(flight_dir or ""), str(hold), str(spike)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", "the torch holder did not start"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=30)


def smi(query: str, what: str = "--query-gpu") -> list[list[int]]:
    out = subprocess.run(["nvidia-smi", f"{what}={query}", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [[int(x) for x in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def require_host_pid_view(*pids: int) -> None:
    """NVML names processes by the pids of the host's PID namespace. In a container without
    that view they are not this process's children's pids, and no per-pid figure can be
    checked here: skip, saying so."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        listed = {row[0] for row in smi("pid", "--query-compute-apps")}
        if listed >= set(pids):
            return
        time.sleep(0.5)
    pytest.skip(f"nvidia-smi lists pids {sorted(listed)}, not {sorted(pids)}: no host PID view")


def nvml_free(index: int = 0) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.gpu
def test_gpu_free_and_per_pid_bytes_agree_with_nvidia_smi(flight_dir: Path) -> None:
    """Tolerance: nvidia-smi prints whole MiB; 8 MiB covers rounding and the driver's own
    movement between the two reads while nothing else allocates."""
    rank_proc = start_holder("rs-rank", flight_dir, 2 * GiB)
    other = start_holder("rs-other", None, 1 * GiB)
    require_host_pid_view(rank_proc.pid, other.pid)
    m = card_side(NvmlSource(), flight_dir, holdings_interval=0.2)
    m.start()
    try:
        [c] = wait_for(
            lambda: [c for c in m.cards_json()["cards"]
                     if c["gpu"] == 0 and c["free"] is not None
                     and {p["pid"] for p in c["processes"]} >= {rank_proc.pid, other.pid}],
            timeout=30,
        )  # fmt: skip
        [[smi_free]] = smi("memory.free")
        assert abs(c["free"] - smi_free * MiB) <= 8 * MiB, (c["free"], smi_free)
        apps = {pid: used for pid, used in smi("pid,used_memory", "--query-compute-apps")}
        ours = {p["pid"]: p for p in c["processes"]}
        for pid in (rank_proc.pid, other.pid):
            assert abs(ours[pid]["bytes"] - apps[pid] * MiB) <= 8 * MiB, (ours[pid], apps[pid])
        assert (
            ours[rank_proc.pid]["role"],
            ours[rank_proc.pid]["boot"],
            ours[rank_proc.pid]["rank"],
        ) == ("rank", "gpu-boot", 0)
        assert (ours[other.pid]["role"], ours[other.pid]["comm"]) == ("foreign", "rs-other")
        assert ours[rank_proc.pid]["bytes"] >= 2 * GiB
        assert m.up() == {"nvml": True}
    finally:
        m.stop()
        stop(rank_proc)
        stop(other)


@pytest.mark.gpu
def test_gpu_300ms_spike_by_another_process_shows_in_free_min_and_breaches() -> None:
    spike = 6 * GiB
    holder = start_holder("rs-spiker", None, 256 * MiB, spike)
    try:
        free = nvml_free()
        floor = free - spike // 2  # the spike crosses it, the idle card does not
        m = card_side(NvmlSource(), floors=parse_floors(str(floor)), interval=0.1,
                        holdings_interval=0.2)  # fmt: skip
        m.start()
        try:
            wait_for(lambda: [c for c in m.cards_json()["cards"] if c["free"] is not None], 30)
            before = scrape(m)
            assert one(before, "rankscope_gpu_free_min_bytes") > floor
            assert one(before, "rankscope_corridor_breaches_total") == 0

            assert holder.stdin is not None and holder.stdout is not None
            holder.stdin.write("spike\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "done"
            time.sleep(0.25)

            after = scrape(m)
            assert one(after, "rankscope_gpu_free_bytes") > floor  # back above: latest hides it
            assert one(after, "rankscope_gpu_free_min_bytes") <= free - spike + 256 * MiB
            assert one(after, "rankscope_corridor_breaches_total") == 1
            assert one(after, "rankscope_corridor_breach_seconds_total") > 0
            require_host_pid_view(holder.pid)  # the corridor checks above have passed
            names = wait_for(
                lambda: [p for c in m.cards_json()["cards"] if c["gpu"] == 0
                         for p in c["processes"] if p["pid"] == holder.pid],
                timeout=10,
            )  # fmt: skip
            assert (names[0]["comm"], names[0]["role"]) == ("rs-spiker", "foreign")
        finally:
            m.stop()
    finally:
        stop(holder)
