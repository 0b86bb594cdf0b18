"""`rankscope demo`: a small instrumented multi-rank job, end to end, on this machine.

Real ranks (a tiny model over torch.distributed: gloo on CPU, NCCL with GPUs enough), the
daemon over their flight directory and, where installed, a real Prometheus with the shipped
rules and a real Alertmanager with the example routing, all on loopback in a temporary
directory removed on exit or Ctrl-C. Without a GPU the cards are simulated, and the output
says so. The exit status is 0 when every scenario produced exactly its pages.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

from rankscope.daemon.flags import argtype, parse_duration
from rankscope.demo import alerting, services
from rankscope.demo.cards import FLOOR, GiB, SimulatedCards
from rankscope.demo.scenarios import SAMPLER_WINDOW, SCENARIOS, Result, ScenarioRun, Stack
from rankscope.demo.view import View, gib

GPU_FLOOR = 8 * GiB
DEFAULT_PORT = 19400  # the daemon's own default, so the status page is where a user expects
MAX_RANKS = 8  # one host's cards
JUDGED_BY_API = "The scenarios run, and each is judged by what the daemon's API shows instead"


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[*SCENARIOS, "all"],
        help="run this scenario (repeatable); default: all of them in sequence "
        f"({', '.join(SCENARIOS)})",
    )
    parser.add_argument(
        "--duration",
        type=argtype(_seconds),
        default=15.0,
        metavar="DURATION",
        help="how long each scenario serves after its ranks booted: seconds, or with a unit "
        "like the daemon's flags (20, 20s, 1m; default 15s)",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=4,
        help="ranks: 2 pipeline stages of RANKS/2 tensor-parallel ranks "
        f"(4, 6 or {MAX_RANKS}; default 4)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the daemon's port on 127.0.0.1, for its status page (default {DEFAULT_PORT}; "
        "0 picks a free one)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (logs, flight record)"
    )


def main(args: argparse.Namespace) -> int:
    if problem := check_args(args):
        print(f"rankscope demo: {problem}", file=sys.stderr)
        return 2
    requested = args.scenario or ["all"]
    # In the order given, once each.
    names = list(SCENARIOS) if "all" in requested else list(dict.fromkeys(requested))
    view = View()
    workdir = Path(tempfile.mkdtemp(prefix="rankscope-demo-"))
    # Our own handlers, whatever was inherited: a SIGINT ignored by the parent still stops us.
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        results = run(args, names, workdir, view)
    except KeyboardInterrupt:
        view.line("interrupted: stopping the ranks, the daemon, Prometheus and Alertmanager")
        return 130
    except (services.ServiceError, OSError, ValueError) as exc:
        view.line(f"rankscope demo: {exc}")
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if args.keep:
            view.line(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return verdict(results, view)


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return parse_duration(text)


def check_args(args: argparse.Namespace) -> str | None:
    if args.ranks < 4 or args.ranks % 2 or args.ranks > MAX_RANKS:
        return (
            f"--ranks {args.ranks}: the job is 2 pipeline stages of tensor-parallel pairs or "
            f"more on one host, so 4, 6 or {MAX_RANKS}"
        )
    if args.duration < 3:
        return f"--duration {args.duration}: give each scenario at least 3 seconds of serving"
    if not 0 <= args.port <= 65535:
        return f"--port {args.port} is out of range"
    return None


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace, names: list[str], workdir: Path, view: View) -> list[Result]:
    try:
        import torch

        gpu = bool(torch.cuda.is_available())
    except ImportError:
        gpu = False
    floor = GPU_FLOOR if gpu else FLOOR
    flight_dir = workdir / "flight"
    flight_dir.mkdir()
    port = args.port or services.free_port()
    if not services.port_free(port):
        raise ValueError(
            f"127.0.0.1:{port} is taken (another rankscope daemon?); pass --port 0 for a free port"
        )
    # Holdings scanned about as often as the card is sampled, so the progress lines' holdings
    # and free memory are of nearly one instant.
    daemon_args = ["--sampler.interval=100ms", f"--sampler.window={SAMPLER_WINDOW:g}s"]
    daemon_args += ["--holdings.interval=200ms", f"--corridor.floor={floor}"]
    cards: SimulatedCards | None = None
    if gpu:
        view.line(f"GPU present: the cards are real (NVML); floor {gib(floor)} per card")
    else:
        cards = SimulatedCards.for_ranks(workdir / "cards.json", args.ranks)
        cards.write()
        daemon_args += ["--device.source=script", f"--device.script={cards.path}"]
        view.line(
            "no GPU here: the cards are SIMULATED (the daemon's scripted device source, "
            f"{cards.count} simulated cards); the ranks, their collectives, the foreign "
            "holder and every pid on the cards are real processes, only their byte counts "
            f"are scripted; floor {gib(floor)} per card"
        )
    with contextlib.ExitStack() as stack:
        daemon = stack.enter_context(services.daemon(workdir, flight_dir, port, daemon_args))
        view.line(f"daemon: {daemon.url}/metrics; watch the status page at {daemon.url}/")
        receiver = start_alerting(stack, workdir, port, view)
        shared = Stack(
            workdir,
            flight_dir,
            daemon,
            receiver,
            cards,
            view,
            ranks=args.ranks,
            duration=args.duration,
            floor=floor,
        )
        for name in names:
            ScenarioRun(shared, SCENARIOS[name]).run()
        return list(shared.results.values())


def start_alerting(
    stack: contextlib.ExitStack, workdir: Path, port: int, view: View
) -> services.WebhookReceiver | None:
    """Prometheus with the shipped rules scraping the daemon on ``port``, Alertmanager with
    the example routing, and the pages' receiver; None without binaries or routing."""
    prometheus_bin = shutil.which("prometheus")
    # Debian's name first
    alertmanager_bin = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not (prometheus_bin and alertmanager_bin):
        installed = "are not both installed (scripts/demo.sh installs them)"
        view.line(f"no pages: prometheus and prometheus-alertmanager {installed}. {JUDGED_BY_API}")
        return None
    try:
        example = alerting.example_routing()
    except FileNotFoundError as exc:
        view.line(f"no pages: {exc}. {JUDGED_BY_API}")
        return None
    rule_file = workdir / "rankscope.rules.yml"
    rule_file.write_text(alerting.rules_text())
    receiver = stack.enter_context(services.WebhookReceiver())
    routing = alerting.demo_routing(example, receiver.url)
    am = stack.enter_context(
        services.alertmanager(alertmanager_bin, workdir / "alertmanager", routing)
    )
    prom = stack.enter_context(
        services.prometheus(
            prometheus_bin,
            workdir / "prometheus",
            scrape_targets=[f"127.0.0.1:{port}"],
            rule_files=[rule_file],
            alertmanager_url=am.url,
        )
    )
    view.line(
        f"prometheus: {prom.url} (the shipped rules, `for:` shortened for the demo); "
        f"alertmanager: {am.url} (routing from {alerting.EXAMPLE_ORIGIN}); pages arrive at {receiver.url}"
    )
    return receiver


def verdict(results: list[Result], view: View) -> int:
    view.banner("verdict")
    for r in results:
        expected = ", ".join(sorted(r.scenario.expected)) or "no page"
        paged = ", ".join(p.alertname for p in r.pages) or "no page"
        got = f"paged {paged}" if r.checked else "pages not checked (no Alertmanager)"
        shown = ", ".join(sorted(r.shown)) or "nothing"
        view.line(
            f"{'PASS' if r.ok else 'FAIL'} {r.scenario.name}: expected {expected}; {got}; "
            f"the daemon's API showed {shown}"
        )
        for note in r.notes:
            view.line(f"     {note}")
    return 0 if results and all(r.ok for r in results) else 1
