"""End to end: real ranks -> flight directories -> the real daemon -> a real Prometheus with
the generated rules -> a real Alertmanager with the shipped routing -> a webhook here.

Two daemons stand for two hosts (a flight directory and a simulated device script each: no
GPU here, so the cards are the daemon's scripted source, labelled simulated). Four rank
processes form one real torch.distributed gloo group, ranks 0-1 on "host" A and 2-3 on B,
count their all_reduce calls with rankscope.rank.census and snapshot every 5 iterations, with
the in-process comparison on. Their boot marks are simulated (a mark's device numbers need
a GPU) and say so in the record.

A healthy run first: for BOUND_S seconds no alert may even be pending and no page arrive.
Then five faults at once: a 300 ms corridor trough (shorter than the 1 s scrape interval)
on card A1, rank 2 skipping one all_reduce, a foreign process (`sleep`) holding 3GiB on
card A0, NCCL's RAS on host A reporting a dead peer, and card B1 exhausted (free at or
below --oom.free-below: the sampler's OOM instant, which pages with its holders). Each must page through its
receiver, with the right labels, within BOUND_S. NCCL RAS needs a GPU: host A's daemon
polls a STAND-IN RAS server (tests/support/ras_standin.py) that replays the real NCCL
2.28.9 JSON report byte-for-byte, then a dead-peer report edited from it
(tests/nccl_ras_shapes.py).
Last, every panel query of every dashboard, variables substituted with values from this
Prometheus, must return data.

The rules are the shipped ones generated with TEST_CONFIG: the same expressions with the
`for:` durations, windows and the slow alerts' evaluation interval shortened; promtool's unit
tests (alerts/tests) prove the shipped values.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from tests import nccl_ras_shapes
from tests.support import services
from tests.support.ras_standin import StandInRas

from rankscope.mixin import render
from rankscope.record import Mark

ROOT = Path(__file__).resolve().parents[2]
AM_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
BOOT = "e2e-boot"
GROUP = "tp:0-3"
WORLD = 4
STEP_S = 0.1  # one scheduler iteration of the simulated ranks
CENSUS_EVERY = 5  # a snapshot every 5 iterations
BOUND_S = 30.0  # the stated bound: fault -> page, at TEST_CONFIG and 1 s intervals
GiB = 1 << 30
FLOOR = 2 * GiB
TEST_CONFIG: dict[str, Any] = {
    "corridorBreachWindow": "30s",
    "corridorThinFor": "5s",
    "censusSkewLookback": "10s",
    "censusSkewFor": "3s",
    "censusStallSeconds": 10,
    "censusStalledFor": "2s",
    "foreignHolderFor": "3s",
    "exporterDownFor": "5s",
    "samplerLagWindow": "10s",
    "samplerLaggingFor": "5s",
    "slowAlertsInterval": "1s",
}
# Alertmanager timings for the test; the routing tree and the inhibitions stay as shipped.
FAST_ROUTE = {"group_wait": "1s", "group_interval": "1s"}


# --- the rank processes ---------------------------------------------------------------------


def _simulated_mark(phase: str, rank: int, uuid: str, reserved: int, process: int) -> Mark:
    """A mark as rankscope.rank.probe writes it on a GPU; the numbers are SIMULATED (no GPU here)."""
    total = 80 * GiB
    raw = {
        "phase": phase,
        "extra": {"simulated": True},
        "device": {"index": rank % 2, "uuid": uuid, "nvml_index": rank % 2, "why": None},
        "torch": {
            "reserved": reserved,
            "allocated": reserved - GiB // 4,
            "peak_allocated": reserved,
            "num_alloc_retries": 0,
            "num_ooms": 0,
            "why": None,
        },
        "driver": {"free": total - process - GiB, "total": total, "why": None},
        "nvml": {"self_bytes": process, "procs": {}, "why": None},
        "arenas": {
            "kv": {"reserved": reserved // 2, "backed": reserved // 4, "retained": 0, "why": None}
        },
        "derived": {
            "non_torch": process - reserved,
            "non_torch_measured": True,
            "unbacked_reservation": reserved // 4,
        },
    }
    bad: list[str] = []
    mark = Mark.parse(raw, bad)
    assert mark is not None and not bad, bad
    return mark


def rank_main(rank: int, store: Path, control: Path, uuid: str) -> None:
    """One rank: a real gloo group, counted all_reduces, census ticks, simulated marks."""
    import datetime

    import torch
    import torch.distributed as dist

    from rankscope.rank import census
    from rankscope.rank.writer import RECORDER

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    census.enable_comparison()
    for n, phase in enumerate(("pre_weight_load", "weights_loaded", "kv_pool_sized")):
        reserved = (n * 12 + 1) * GiB
        RECORDER.write_record(_simulated_mark(phase, rank, uuid, reserved, reserved + GiB))
    group = census.group_instance("tp", range(WORLD))
    tensor = torch.ones(1)
    skip = control / f"skip-rank-{rank}"
    skipped = False
    while True:
        if not skipped and skip.exists():
            skipped = True  # the fault: this rank skips one collective
        else:
            census.count(group, "all_reduce")
            dist.all_reduce(tensor)
        census.tick()
        time.sleep(STEP_S)


# --- the test's own webhook receiver --------------------------------------------------------


class Webhook:
    """Records every notification Alertmanager posts: (monotonic arrival, path, body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[float, str, dict[str, Any]]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                posts.append((time.monotonic(), self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def firing(self) -> list[tuple[float, str, dict[str, Any]]]:
        """(arrival, receiver, alert) for every firing alert in every post."""
        return [
            (at, path.strip("/"), alert)
            for at, path, body in self.posts
            for alert in body["alerts"]
            if alert["status"] == "firing"
        ]


def alertmanager_config(webhook_url: str) -> str:
    """The shipped example with the receiver URLs pointed here and the group timings
    shortened; routes, matchers, grouping and inhibitions untouched."""
    doc = yaml.safe_load(AM_EXAMPLE.read_text())
    for receiver in doc["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{webhook_url}/{receiver['name']}"
    routes = [doc["route"], *doc["route"].get("routes", [])]
    for route in routes:
        for key, value in FAST_ROUTE.items():
            if key in route or route is doc["route"]:
                route[key] = value
    return yaml.safe_dump(doc)


def test_alertmanager_config_keeps_the_shipped_tree() -> None:
    shipped = yaml.safe_load(AM_EXAMPLE.read_text())
    rewritten = yaml.safe_load(alertmanager_config("http://127.0.0.1:1"))
    assert rewritten["inhibit_rules"] == shipped["inhibit_rules"]

    def tree(route: dict[str, Any]) -> Any:
        return (
            route["receiver"],
            route.get("group_by"),
            route.get("matchers"),
            [tree(r) for r in route.get("routes", [])],
        )

    assert tree(rewritten["route"]) == tree(shipped["route"])
    assert rewritten["route"]["group_wait"] == "1s"


# --- the stack --------------------------------------------------------------------------------


def write_cards(script: Path, cards: list[dict[str, Any]]) -> None:
    """Replace a simulated device script atomically, as the scripted source expects."""
    tmp = script.with_name(f".{script.name}.tmp")
    tmp.write_text(json.dumps({"cards": cards}))
    os.replace(tmp, script)


def card(index: int, uuid: str, free: int, processes: dict[int, int]) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid,
        "model": "Simulated H200",
        "total": 80 * GiB,
        "free": free,
        "processes": {str(pid): held for pid, held in processes.items()},
    }


class Host:
    """One simulated host: a flight directory, a device script and its daemon."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.flight = workdir / f"flight-{name}"
        self.flight.mkdir()
        self.script = workdir / f"cards-{name}.json"
        self.port = services.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = workdir / f"daemon-{name}.log"
        self.uuids = (f"GPU-e2e-{name}0", f"GPU-e2e-{name}1")
        self.rank_pids: dict[int, int] = {}  # card slot -> rank pid
        self.proc: subprocess.Popen[bytes] | None = None
        self.ras: StandInRas | None = None  # a stand-in NCCL RAS endpoint the daemon polls

    def cards(
        self,
        *,
        trough: bool = False,
        foreign: dict[int, int] | None = None,
        exhausted: bool = False,
    ) -> list[dict]:
        out = []
        for slot, uuid in enumerate(self.uuids):
            held = {self.rank_pids[slot]: 30 * GiB} if slot in self.rank_pids else {}
            if slot == 0 and foreign:
                held.update(foreign)
            free = 80 * GiB - sum(held.values()) - 2 * GiB
            if trough and slot == 1:
                free = FLOOR // 2
            if exhausted and slot == 1:  # at or below --oom.free-below: an OOM instant
                free = 128 << 20
            out.append(card(slot, uuid, free, held))
        return out

    def start(self) -> None:
        write_cards(self.script, self.cards())
        argv = [sys.executable, "-m", "rankscope", "serve", f"--flight-dir={self.flight}"]
        argv += [f"--web.listen-address={self.address}", "--device.source=script"]
        argv += [f"--device.script={self.script}", "--corridor.floor=2GiB"]
        argv += ["--holdings.interval=500ms"]
        if self.ras is not None:
            argv += ["--collector.nccl-ras", f"--collector.nccl-ras.address={self.ras.address}"]
            argv += ["--collector.nccl-ras.interval=500ms"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def start_rank(
    rank: int, host: Host, store: Path, control: Path, log: Path
) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        RANK=str(rank),
        LOCAL_RANK=str(rank % 2),
        WORLD_SIZE=str(WORLD),
        RANKSCOPE_DIR=str(host.flight),
        RANKSCOPE_BOOT_ID=BOOT,
        RANKSCOPE_CENSUS_EVERY=str(CENSUS_EVERY),
    )
    code = (
        "import sys; from pathlib import Path; from tests.mixin.test_e2e_alerts import rank_main; "
        f"rank_main({rank}, Path({str(store)!r}), Path({str(control)!r}), {host.uuids[rank % 2]!r})"
    )
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            services.stop(proc, grace=10)


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float,
    logs: list[Path],
    diagnose: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in logs if p.exists())
    state = diagnose() if diagnose else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{state}\n{tails}")


def prometheus_state(prom: services.Prometheus) -> str:
    """What Prometheus holds of the faults, for a failure message."""
    lines = []
    for expr in (
        "ALERTS",
        "rankscope_corridor_breaches_total",
        "rankscope_gpu_free_min_bytes",
        "rankscope_sampler_overruns_total",
        "rankscope_census_round",
        "rankscope_census_round_collectives",
        "rankscope_census_rank_deficit",
        "rankscope_census_group_round",
        "rankscope_census_group_digest",
        "rankscope:census_group_digests",
        "rankscope_census_divergence",
    ):
        found = [(r["metric"], r["value"][1]) for r in prom.query(expr)]
        lines.append(f"{expr}: {found}")
    return "\n".join(lines)


def breaches(host: Host, slot: int) -> int:
    cards = json.loads(services.http_get(f"http://{host.address}/api/v1/cards"))["cards"]
    return int(next(c for c in cards if c["uuid"] == host.uuids[slot])["breaches"] or 0)


def trough(host: Host, foreign: dict[int, int], attempts: int = 3) -> None:
    """A 300 ms trough below the floor on card 1, between two 1 s scrapes. A sampler starved
    of CPU for the whole 300 ms (this machine is shared) never sees it; then the trough is
    repeated, at most ``attempts`` times, and the daemon's own count says when it was seen."""
    before = breaches(host, 1)
    for _ in range(attempts):
        write_cards(host.script, host.cards(trough=True, foreign=foreign))
        time.sleep(0.3)
        write_cards(host.script, host.cards(foreign=foreign))
        if breaches(host, 1) > before:
            return
    raise AssertionError(f"the sampler missed {attempts} troughs of 300 ms: starved of CPU?")


# --- dashboards against the live Prometheus -----------------------------------------------------


def _label_values(prom: services.Prometheus, query: str) -> list[str]:
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip(), re.S)
    assert match, f"not a label_values query: {query}"
    expr, label = match.groups()
    return sorted({s["metric"][label] for s in prom.query(expr) if label in s["metric"]})


def substitute(text: str, values: dict[str, str]) -> str:
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        text = text.replace("${" + name + "}", value).replace("$" + name, value)
    return text


def check_dashboards(prom: services.Prometheus) -> list[str]:
    """Every variable resolves to real values, every panel target returns data; returns
    what failed. Multi-value variables are substituted as Grafana does: (a|b)."""
    failures = []
    for name, board in render.dashboards().items():
        values = {"__rate_interval": "5s", "__interval": "1s", "__range": "5m"}
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            found = _label_values(prom, substitute(var["definition"], values))
            if not found:
                failures.append(f"{name}: variable {var['name']} has no values")
            # Regex-escaped, then escaped again for the PromQL string, as Grafana does.
            regex = "(" + "|".join(re.escape(v) for v in found) + ")"
            values[var["name"]] = regex.replace("\\", "\\\\")
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = substitute(target["expr"], values)
                if not prom.query(expr):
                    failures.append(f"{name}: {panel['title']!r}: no data for {expr}")
    return failures


# --- the test ------------------------------------------------------------------------------------


def test_faults_page_and_a_healthy_run_pages_nothing(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    rules_file = tmp_path / "rankscope.rules.yml"
    rules_file.write_text(render.rules_yaml(TEST_CONFIG))
    hosts = {"a": Host("a", tmp_path), "b": Host("b", tmp_path)}
    rank_host = {0: hosts["a"], 1: hosts["a"], 2: hosts["b"], 3: hosts["b"]}
    logs = [h.log for h in hosts.values()] + [tmp_path / f"rank{r}.log" for r in range(WORLD)]
    webhook = Webhook()
    sleeper: subprocess.Popen[bytes] | None = None
    store = tmp_path / "gloo-store"  # a file rendezvous: no port to race for
    try:
        with StandInRas(nccl_ras_shapes.REAL_JSON) as ras, processes() as started:
            hosts["a"].ras = ras
            for rank, host in rank_host.items():
                started.append(start_rank(rank, host, store, control, tmp_path / f"rank{rank}.log"))
                host.rank_pids[rank % 2] = started[-1].pid
            for host in hosts.values():
                host.start()
                started.append(host.proc)  # type: ignore[arg-type]
            for host in hosts.values():
                services.wait_http(f"http://{host.address}/metrics", timeout=60, proc=host.proc)
            with (
                services.alertmanager(tmp_path / "am", alertmanager_config(webhook.url)) as am,
                services.prometheus(
                    tmp_path / "prom",
                    scrape_targets=[h.address for h in hosts.values()],
                    rule_files=[rules_file],
                    alertmanager_url=am.url,
                ) as prom,
            ):
                # Ready: every rank snapshots, and every rank is attributed to its card.
                wait_for(
                    "census snapshots of all ranks",
                    lambda: (
                        len(prom.query(f'rankscope_census_round{{boot="{BOOT}"}} > 0')) == WORLD
                    ),
                    90,
                    logs,
                )
                wait_for(
                    "holdings attributed to the ranks",
                    lambda: (
                        len(prom.query(f'rankscope_gpu_process_bytes{{role="rank",boot="{BOOT}"}}'))
                        == WORLD
                    ),
                    30,
                    logs,
                )

                # The healthy run: nothing pending, nothing firing, no page; and the
                # skew was computed throughout (0), not merely absent.
                time.sleep(BOUND_S)
                window = f"{int(BOUND_S)}s"
                alerts = f'max_over_time(ALERTS{{alertname=~"Rankscope.+"}}[{window}])'
                assert prom.query(alerts) == []
                assert webhook.posts == []
                # One digest among the hosts at the group's round throughout: they agreed.
                agreed = f'max_over_time(rankscope:census_group_digests{{boot="{BOOT}"}}[{window}])'
                assert [r["value"][1] for r in prom.query(agreed)] == ["1"]

                # The faults, at once.
                a, b = hosts["a"], hosts["b"]
                sleeper = subprocess.Popen(["sleep", "600"])
                foreign = {sleeper.pid: 3 * GiB}
                injected = time.monotonic()
                write_cards(a.script, a.cards(foreign=foreign))
                (control / "skip-rank-2").touch()
                ras.reports = [nccl_ras_shapes.dead_peer_json()]
                write_cards(b.script, b.cards(exhausted=True))
                trough(a, foreign)

                def skew_pages() -> list[dict[str, str]]:
                    return [
                        alert["labels"]
                        for _, _, alert in webhook.firing()
                        if alert["labels"]["alertname"] == "RankscopeCensusSkew"
                    ]

                expected = {
                    "RankscopeCorridorBreach",
                    "RankscopeCensusSkew",
                    "RankscopeForeignHolder",
                    "RankscopeNcclPeerDead",
                    "RankscopeOutOfMemory",
                }
                wait_for(
                    "the five pages, the skew naming its rank",
                    lambda: (
                        expected
                        <= {alert["labels"]["alertname"] for _, _, alert in webhook.firing()}
                        and any("rank" in labels for labels in skew_pages())
                    ),
                    BOUND_S,
                    [*logs, prom.log, am.log],
                    diagnose=lambda: f"pages: {webhook.posts}\n{prometheus_state(prom)}",
                )
                pages: dict[str, tuple[float, str, dict[str, Any]]] = {}
                for at, receiver, alert in webhook.firing():
                    # Host B's exhausted card breaches too: the breach checked is host A's.
                    labels = alert["labels"]
                    breach = labels["alertname"] == "RankscopeCorridorBreach"
                    if breach and labels.get("instance") != a.address:
                        continue
                    pages.setdefault(labels["alertname"], (at, receiver, alert))
                assert set(pages) == expected, f"unexpected pages: {set(pages) - expected}"

                _, receiver, breach = pages["RankscopeCorridorBreach"]
                assert receiver == "rankscope-pager"
                assert {
                    "gpu": "1",
                    "uuid": a.uuids[1],
                    "instance": a.address,
                    "severity": "critical",
                }.items() <= breach["labels"].items()

                # The first skew page may come from the ranks' own comparison (no rank
                # label); the one from host B's daemon names rank 2 there, and no healthy
                # rank is ever named. The hosts agree on the group's digest (B's most
                # advanced rank is healthy), so no page names the group alone.
                _, receiver, _ = pages["RankscopeCensusSkew"]
                assert receiver == "rankscope-pager"
                ranked = [labels for labels in skew_pages() if "rank" in labels]
                assert {
                    "boot": BOOT,
                    "group": GROUP,
                    "op": "all_reduce",
                    "rank": "2",
                    "instance": b.address,
                    "severity": "critical",
                }.items() <= ranked[0].items()
                assert {labels["rank"] for labels in ranked} == {"2"}
                assert all(
                    (labels["boot"], labels["group"], labels.get("op"))
                    == (BOOT, GROUP, "all_reduce")
                    for labels in skew_pages()
                )

                _, receiver, holder = pages["RankscopeForeignHolder"]
                assert receiver == "rankscope-tickets"
                assert {
                    "pid": str(sleeper.pid),
                    "comm": "sleep",
                    "boot": BOOT,
                    "gpu": "0",
                    "uuid": a.uuids[0],
                    "instance": a.address,
                    "severity": "warning",
                }.items() <= holder["labels"].items()
                assert str(sleeper.pid) in holder["annotations"]["description"]

                _, receiver, dead = pages["RankscopeNcclPeerDead"]
                assert receiver == "rankscope-pager"
                assert {
                    "endpoint": ras.address,
                    "instance": a.address,
                    "severity": "critical",
                }.items() <= dead["labels"].items()

                latency = {name: round(page[0] - injected, 1) for name, page in pages.items()}
                print(
                    f"\nfault -> page seconds at TEST_CONFIG, 1s scrape/eval, 1s group_wait: {latency}"
                )
                assert max(latency.values()) <= BOUND_S

                failures = check_dashboards(prom)
                assert failures == [], "\n".join(failures)
    finally:
        if sleeper is not None:
            services.stop(sleeper, grace=10)
        webhook.close()
