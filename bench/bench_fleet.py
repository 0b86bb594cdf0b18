"""The shipped rules and dashboards at fleet scale, on a real Prometheus.

    python3 bench/bench_fleet.py [--hosts 64] [--wait 90] [--out DIR] [--rules FILE]
                                 [--dashboards DIR] [--name NAME]

SIMULATED targets: one HTTP server in this process serves, for each of --hosts hosts, the
text exposition a daemon would serve (every metric of the catalog, rankscope.catalog): 8
cards, 8 ranks of one job spanning every host (so the census groups hold hosts x 8 ranks),
100 census series per rank (20 groups x 5 ops: world, the host's tp group, the pp group of
its local rank, 17 more spanning every rank) and the host's round and digest of each of the
27 group instances its ranks are in (equal on every host: a healthy fleet), 64 processes
per card and its largest foreign holder, phases, posts and arenas. The NCCL RAS collector
(off by default) publishes nothing here. A real Prometheus (`prometheus` on PATH) scrapes each host as its own target
(instance="host-N:19400", job="rankscope") every 15 s and evaluates
alerts/rankscope.rules.yml (or --rules, e.g. an older version for a before/after in one
sitting) every 15 s, a group with an `interval` of its own (rankscope.alerts.slow) at that.
After --wait seconds it reports:

- series per host as scraped (count by instance, recording rules left out);
- each rule group's evaluation time from /api/v1/rules at three evaluations (read every 15 s
  until each group has three: longer for a group with a longer interval), as a
  fraction of its interval (goal < 1%), and the slowest rule of each group: first while
  Prometheus ingests every 15 s, then with ingestion paused (the config reloaded with an
  hourly scrape), which leaves the evaluation the machine to itself;
- every dashboard panel's query (dashboards/*.json; $gpu, $boot, $group as .*,
  $__rate_interval as 1m; $instance as every host, then as one host) as a range query over the last
  2 minutes at a 15 s step, timed by Prometheus itself (stats=all: evalTotalTime), the
  median of three runs (one for a panel over 2 s), and the series it returns.

Values are those of a healthy fleet (VALUES: no breach, fresh snapshots, a sampler that
samples), so no alert is active but RankscopeForeignHolder, once per card (its 63 foreign
holders): an active alert costs its group the bookkeeping and the description's template,
which a fleet where every alert fires would measure instead of the rules. Budget: about
5 minutes, 7 with a group evaluated every minute (--skip-panels saves one or two).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rankscope.catalog import CATALOG, Metric
from rankscope.reports.census import RUNNING, STATES

REPO = Path(__file__).resolve().parent.parent
RANKS_PER_HOST = 8
CARDS = 8
PROCESSES_PER_CARD = 64
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
PHASES = ("import", "init", "weights", "kv_cache", "graphs", "ready")
POSTS = ("weights", "kv_cache", "graphs", "activations")
GiB = 1 << 30


def groups_of(host: int, local: int) -> list[str]:
    return ["world", f"tp{host}", f"pp{local}", *(f"layer{k}" for k in range(17))]


# Published only while a rank is behind, or stalled or dead: none in a healthy fleet.
BEHIND_ONLY = (
    "rankscope_census_rank_deficit",
    "rankscope_census_latest_deficit",
    "rankscope_census_blocked_collective",
)


def label_sets(m: Metric, host: int) -> list[dict[str, str]]:
    """Every label set a daemon on ``host`` exposes for ``m``."""
    ranks = [(local, host * RANKS_PER_HOST + local) for local in range(RANKS_PER_HOST)]
    cards = [{"gpu": str(c), "uuid": f"GPU-{host:04d}-{c}"} for c in range(CARDS)]

    def rank_labels(local: int, rank: int) -> dict[str, str]:
        return {"boot": "boot-1", "rank": str(rank), "tp_rank": str(local), "pp_rank": "0",
                "runner": "sglang", "pid": str(1000 + local), **cards[local]}  # fmt: skip

    labels = m.labels
    if m.name.startswith("rankscope_oom_") or labels == ("field",):
        return []  # published only after an OOM, or an invalid flight field: none here
    if m.collector == "nccl-ras" or m.name in BEHIND_ONLY:
        return []  # a collector off by default; census figures of a rank behind or stuck
    if labels and labels[:2] == ("boot", "rank") and "phase" in labels:
        return [{**rank_labels(lo, r), "phase": p} for lo, r in ranks for p in PHASES]
    if "post" in labels:
        return [
            {**rank_labels(lo, r), "post": p, "view": v}
            for lo, r in ranks for p in POSTS for v in ("allocator", "driver", "process")
        ]  # fmt: skip
    if "arena" in labels:
        return [
            {"boot": "boot-1", "rank": str(r), "pid": str(1000 + lo), "arena": a}
            for lo, r in ranks for a in ("kv", "weights")
        ]  # fmt: skip
    if labels == ("gpu", "uuid", "model", "source"):
        return [{**c, "model": "NVIDIA H200", "source": "nvml"} for c in cards]
    if labels == ("gpu", "uuid"):
        return cards
    if labels == ("gpu", "uuid", "pid", "comm"):  # the largest foreign holder of each card
        return [
            {**card, "pid": str(20000 + c * 100), "comm": "worker0"} for c, card in enumerate(cards)
        ]
    if labels == ("source", "gpu", "uuid"):
        return [{"source": "nvml", **c} for c in cards] + [
            {"source": "nvml", "gpu": "", "uuid": ""}
        ]
    if "comm" in labels:
        out = []
        for c, card in enumerate(cards):
            out.append({**card, "pid": str(1000 + c), "comm": "python3", "role": "rank",
                        "boot": "boot-1", "rank": str(host * RANKS_PER_HOST + c)})  # fmt: skip
            out += [
                {**card, "pid": str(20000 + c * 100 + k), "comm": f"worker{k}",
                 "role": "foreign", "boot": "", "rank": ""}
                for k in range(PROCESSES_PER_CARD - 1)
            ]  # fmt: skip
        return out
    if labels == ("boot", "rank", "group", "op"):
        return [
            {"boot": "boot-1", "rank": str(r), "group": g, "op": op}
            for lo, r in ranks for g in groups_of(host, lo) for op in OPS
        ]  # fmt: skip
    if labels == ("boot", "rank"):
        return [{"boot": "boot-1", "rank": str(r)} for _, r in ranks]
    if labels == ("boot", "rank", "state"):  # every state of every rank, as the daemon does
        return [{"boot": "boot-1", "rank": str(r), "state": s} for _, r in ranks for s in STATES]
    if labels == ("boot", "group", "op"):
        return []  # published only while ranks diverge
    if labels == ("boot", "group"):  # the host's summary of each group its ranks are in
        local = sorted({g for lo, _ in ranks for g in groups_of(host, lo)})
        return [{"boot": "boot-1", "group": g} for g in local]
    if labels == ("version",):
        return [{"version": "0.0.0-fleet"}]
    if labels == ("source",):
        return [{"source": "flight"}, {"source": "nvml"}]
    if labels == ("collector",):
        return [
            {"collector": c} for c in ("self", "phases", "arenas", "census", "cards", "holdings")
        ]
    if labels == ("reason",):
        return [{"reason": "malformed"}]
    if labels == ():
        return [{}]
    raise ValueError(f"bench_fleet: no label sets for {m.name} {labels}")


# A healthy fleet: no breach, no overrun, a sampler that samples, fresh census snapshots, a
# floor below the free memory; only the 63 foreign holders of every card are a fault
# (RankscopeForeignHolder fires on each of the 512 cards). Placeholders are filled per scrape.
NOW, SAMPLES = "@now@", "@samples@"
VALUES = {
    "rankscope_corridor_floor_bytes": str(2 * GiB),
    "rankscope_corridor_breach_seconds_total": "0",
    "rankscope_corridor_breaches_total": "0",
    "rankscope_sampler_overruns_total": "0",
    "rankscope_census_snapshot_timestamp_seconds": NOW,
    "rankscope_sampler_duration_seconds_count": SAMPLES,
}


def exposition(host: int) -> str:
    lines = []
    for m in CATALOG:
        names = [m.name]
        if m.type == "summary":
            names = [m.name + "_sum", m.name + "_count"]
        for labels in label_sets(m, host):
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            for name in names:
                value = VALUES.get(name, str(40 * GiB if m.unit == "bytes" else 100))
                if "state" in labels:  # every rank running: 1 for that state, 0 for the rest
                    value = str(int(labels["state"] == RUNNING))
                lines.append(f"{name}{{{text}}} {value}")
    return "\n".join(lines) + "\n"


class Targets(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hosts: int) -> None:
        self.started = time.time()
        self.texts = {f"/host/{h}/metrics": exposition(h) for h in range(hosts)}
        super().__init__(("127.0.0.1", 0), Handler)

    def body(self, path: str) -> bytes | None:
        text = self.texts.get(path)
        if text is None:
            return None
        now = time.time()
        samples = int((now - self.started) * 10)  # the sampler at 100 ms
        text = text.replace(NOW, f"{now:.3f}").replace(SAMPLES, str(samples))
        return gzip.compress(text.encode(), compresslevel=1)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        assert isinstance(self.server, Targets)
        body = self.server.body(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else base + path
    with urllib.request.urlopen(url, timeout=120) as r:
        doc = json.loads(r.read())
    if doc.get("status") != "success":
        raise RuntimeError(f"{path}: {doc}")
    return doc["data"]


def panel_queries(dashboards: Path) -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) for every target of every generated dashboard."""
    out = []
    for path in sorted(dashboards.glob("*.json")):
        doc = json.loads(path.read_text())

        def walk(panels: list[dict[str, Any]], dash: str = path.stem) -> None:
            for p in panels:
                walk(p.get("panels", []))
                for t in p.get("targets", []):
                    if t.get("expr"):
                        out.append((dash, p.get("title", ""), t["expr"]))

        walk(doc.get("panels", []))
    return out


def substitute(expr: str, instance: str = ".*") -> str:
    expr = expr.replace("$__rate_interval", "1m")
    expr = re.sub(r"\$\{?instance(?::[a-z]+)?\}?", instance, expr)
    return re.sub(r"\$\{?(gpu|boot|group)(?::[a-z]+)?\}?", ".*", expr)


def rule_groups(base: str, when: str, since: float, wanted: int = 3) -> dict[str, Any]:
    """Each rule group's evaluation time at ``wanted`` distinct evaluations from ``since``
    (Unix seconds) on, read from /api/v1/rules every 15 s until every group has that many (a
    group with an interval of its own, longer than 15 s, takes longer), as printed."""
    first = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since))  # RFC 3339, to the second
    by_group: dict[str, dict[str, dict[str, Any]]] = {}
    while True:
        groups = api(base, "/api/v1/rules")["groups"]
        for g in groups:
            by_group.setdefault(g["name"], {})
            if g.get("lastEvaluation", "")[:19] < first:
                continue  # not evaluated yet, or before this phase
            slowest = max(g["rules"], key=lambda r: r.get("evaluationTime", 0))
            by_group.setdefault(g["name"], {})[g.get("lastEvaluation")] = {
                "seconds": g["evaluationTime"], "interval": g["interval"],
                "last": g.get("lastEvaluation"), "slowest_rule": slowest.get("name"),
                "slowest_seconds": slowest.get("evaluationTime"),
                "rule_seconds": {r["name"]: r.get("evaluationTime") for r in g["rules"]},
                "active_alerts": {r["name"]: len(r["alerts"]) for r in g["rules"] if r.get("alerts")},
            }  # fmt: skip
        if all(len(evaluations) >= wanted for evaluations in by_group.values()):
            break
        time.sleep(15)
    readings = {
        name: list(evaluations.values())[-wanted:] for name, evaluations in by_group.items()
    }
    out: dict[str, Any] = {}
    print(f"\nrule group evaluation {when} ({wanted} evaluations of each group):")
    for name, rs in readings.items():
        secs = [r["seconds"] for r in rs]
        interval = rs[0]["interval"]
        worst = max(rs, key=lambda r: r["seconds"])
        out[name] = {
            "interval_s": interval, "seconds": secs, "evaluated_at": [r["last"] for r in rs],
            "max_fraction": max(secs) / interval,
            "median_fraction": statistics.median(secs) / interval,
            "slowest_rule": worst["slowest_rule"],
            "slowest_rule_seconds": worst["slowest_seconds"],
            "rule_seconds": worst["rule_seconds"],
            "active_alerts": worst["active_alerts"],
            "active_alerts_each": [sum(r["active_alerts"].values()) for r in rs],
        }  # fmt: skip
        print(
            f"  {name:18s} {statistics.median(secs) * 1e3:8.1f} ms median, "
            f"{max(secs) * 1e3:8.1f} ms max = {max(secs) / interval:6.2%} of {interval:.0f} s"
            f" (goal < 1%); slowest rule {worst['slowest_rule']} "
            f"{worst['slowest_seconds'] * 1e3:.1f} ms"
            + (f"; active alerts {worst['active_alerts']}" if worst["active_alerts"] else "")
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", type=int, default=64)
    p.add_argument("--wait", type=float, default=90.0, help="seconds of scrapes before reading")
    p.add_argument("--out", type=Path, help="directory for NAME.json")
    p.add_argument("--name", default="fleet", help="file name of the output, without .json")
    p.add_argument("--rules", type=Path, default=REPO / "alerts" / "rankscope.rules.yml")
    p.add_argument("--dashboards", type=Path, default=REPO / "dashboards")
    p.add_argument("--skip-panels", action="store_true", help="time the rule groups only")
    args = p.parse_args()
    if shutil.which("prometheus") is None:
        raise SystemExit("bench_fleet: needs `prometheus` on PATH")
    started = time.monotonic()
    targets = Targets(args.hosts)
    threading.Thread(target=targets.serve_forever, daemon=True).start()
    target_port = targets.server_address[1]
    body_kb = statistics.mean(len(targets.body(p) or b"") for p in targets.texts) / 1024
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {
        "hosts": args.hosts,
        "rules": str(args.rules),
        "dashboards": str(args.dashboards),
    }
    with tempfile.TemporaryDirectory() as tmp:
        static = [
            {"targets": [f"127.0.0.1:{target_port}"],
             "labels": {"__metrics_path__": f"/host/{h}/metrics", "instance": f"host-{h}:19400"}}
            for h in range(args.hosts)
        ]  # fmt: skip
        config = {
            "global": {"scrape_interval": "15s", "evaluation_interval": "15s",
                       "scrape_timeout": "10s"},
            "rule_files": [str(args.rules.resolve())],
            "scrape_configs": [{"job_name": "rankscope", "static_configs": static}],
        }  # fmt: skip
        (Path(tmp) / "prometheus.yml").write_text(json.dumps(config))
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "prometheus.log", "w"),  # noqa: SIM115
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(base + "/-/ready", timeout=2).read()
                    break
                except OSError:
                    if prom.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(
                            "bench_fleet: prometheus did not start:\n"
                            + (Path(tmp) / "prometheus.log").read_text()
                        ) from None
                    time.sleep(0.5)
            print(f"{args.hosts} simulated hosts ({body_kb:.0f} KB gzipped each); Prometheus up; "
                  f"waiting {args.wait:.0f} s for scrapes and evaluations", flush=True)  # fmt: skip
            time.sleep(args.wait)
            query = 'count by (instance) ({job="rankscope", __name__!~"rankscope:.*"})'
            per_host = api(base, "/api/v1/query", query=query)["result"]
            counts = sorted(int(s["value"][1]) for s in per_host)
            up = api(base, "/api/v1/query", query='sum(up{job="rankscope"})')["result"]
            result["series_per_host"] = {"min": counts[0], "max": counts[-1]}
            result["targets_up"] = float(up[0]["value"][1]) if up else 0.0
            result["series_total"] = sum(counts)
            print(f"series per host {counts[0]}..{counts[-1]}, {sum(counts)} in all, "
                  f"{result['targets_up']:.0f} of {args.hosts} targets up")  # fmt: skip
            # The evaluations of the last minute ran while Prometheus ingested too.
            result["rule_groups"] = rule_groups(
                base, "while Prometheus ingests every 15 s", since=time.time() - 60
            )
            # The same rules with ingestion paused: scrapes every hour from now on (one
            # scrape on reload at most, then none), so the evaluation has the CPU to itself;
            # the readings end within Prometheus's 5-minute lookback of the last scrape
            # (under 4 minutes for a group evaluated every minute), while samples are fresh.
            config["global"]["scrape_interval"] = "1h"
            (Path(tmp) / "prometheus.yml").write_text(json.dumps(config))
            prom.send_signal(signal.SIGHUP)
            reloaded = time.time()
            time.sleep(30)
            result["rule_groups_quiet"] = rule_groups(base, "with ingestion paused", reloaded)
            end = time.time()
            panels: list[dict[str, Any]] = []
            print("\ndashboard panels (range query, last 2 min, 15 s step, every value selected):")
            for (dash, title, expr), instance in (
                (panel, instance)
                for panel in ([] if args.skip_panels else panel_queries(args.dashboards))
                for instance in (".*", "host-0:19400")
            ):
                query = substitute(expr, instance)
                times, series = [], 0
                for _ in range(3):
                    if times and times[0] > 2.0:
                        break  # a slow panel: once is enough to rank it
                    data = api(base, "/api/v1/query_range", query=query, start=str(end - 120),
                               end=str(end), step="15", stats="all")  # fmt: skip
                    times.append(float(data["stats"]["timings"]["evalTotalTime"]))
                    series = len(data["result"])
                t = statistics.median(times)
                which = "all hosts" if instance == ".*" else "one host"
                panels.append({"dashboard": dash, "panel": title, "query": query,
                               "instance": which, "seconds": t, "series": series})  # fmt: skip
                print(f"  {t * 1e3:8.1f} ms {series:6d} series  {which:9s} {dash}: {title}")
            result["panels"] = panels
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            targets.shutdown()
    result["seconds"] = time.monotonic() - started
    print(f"\ntotal {result['seconds']:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
