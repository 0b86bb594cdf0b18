"""`rankscope serve`: the per-host daemon.

Flags follow the exporter convention (--web.listen-address, --web.config.file,
--collector.<name> / --no-collector.<name>). The default port, 19400, sits outside the
range the Prometheus wiki allocates to exporters (9100-9999, full since 2023), so it collides
with none of them; it is dcgm-exporter's 9400 with a leading 1, for memory.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.daemon import cards
from rankscope.record import ENV_DIR

if TYPE_CHECKING:
    from rankscope.daemon.app import Daemon

log = logging.getLogger("rankscope.daemon")

DEFAULT_PORT = 19400
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
# Every collector that can be switched off; the self collector always runs.
FLIGHT_COLLECTORS = ("phases", "arenas", "census")
CARD_COLLECTORS = ("cards", "holdings")


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; ':PORT' for every IPv4 "
        "interface, '[::]:PORT' for IPv6)",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default=None,
        metavar="FILE",
        help="exporter-toolkit web config: TLS, basic auth (bcrypt), response headers",
    )
    parser.add_argument(
        "--flight-dir",
        dest="flight_dir",
        default=os.environ.get(ENV_DIR),
        metavar="DIR",
        help=f"flight directory the probes write (default ${ENV_DIR})",
    )
    parser.add_argument(
        "--phases.boots",
        dest="phase_boots",
        type=int,
        default=1,
        metavar="N",
        help="publish phase series of the N newest boots (default 1; 0 for every boot)",
    )
    parser.add_argument(
        "--otlp.endpoint",
        dest="otlp_endpoint",
        default=None,
        metavar="URL",
        help="push the metrics by OTLP/HTTP to this base URL (/v1/metrics is appended); "
        "also on when OTEL_EXPORTER_OTLP_ENDPOINT is set",
    )
    parser.add_argument(
        "--otlp.interval",
        dest="otlp_interval",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="time between OTLP pushes (default OTEL_METRIC_EXPORT_INTERVAL, else 15s)",
    )
    parser.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=("debug", "info", "warning", "error"),
    )
    for collector in (*FLIGHT_COLLECTORS, *CARD_COLLECTORS):
        parser.add_argument(
            f"--collector.{collector}",
            dest=f"collector_{collector}",
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"enable the {collector} collector (default on)",
        )
    cards.add_arguments(parser)
    _add_nccl_ras_arguments(parser)


def _add_nccl_ras_arguments(parser: argparse.ArgumentParser) -> None:
    from rankscope.daemon import nccl_ras

    g = parser.add_argument_group("nccl-ras (NCCL's RAS status reports, docs/census.md)")
    g.add_argument(
        "--collector.nccl-ras",
        dest="collector_nccl_ras",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="poll NCCL RAS endpoints (default off)",
    )
    g.add_argument(
        "--collector.nccl-ras.address",
        dest="nccl_ras_address",
        action="append",
        metavar="HOST:PORT",
        help=f"RAS endpoint (NCCL_RAS_ADDR of a job); repeatable, one per job: jobs that "
        f"share the default port answer in turn (SO_REUSEPORT). Default {nccl_ras.DEFAULT_ADDRESS}",
    )
    g.add_argument(
        "--collector.nccl-ras.interval",
        dest="nccl_ras_interval",
        type=_duration,
        default=15.0,
        metavar="DURATION",
        help="time between polls of every endpoint (default 15s)",
    )
    g.add_argument(
        "--collector.nccl-ras.persist-polls",
        dest="nccl_ras_persist_polls",
        type=int,
        default=nccl_ras.DEFAULT_PERSIST_POLLS,
        metavar="N",
        help="successive polls a count mismatch must hold with its lowest count unchanged "
        f"before it is reported (default {nccl_ras.DEFAULT_PERSIST_POLLS})",
    )
    g.add_argument(
        "--collector.nccl-ras.timeout",
        dest="nccl_ras_timeout",
        type=_duration,
        default=nccl_ras.REPORT_TIMEOUT_S,
        metavar="DURATION",
        help=f"deadline for one report after STATUS (default {nccl_ras.REPORT_TIMEOUT_S:g}s)",
    )
    g.add_argument(
        "--collector.nccl-ras.max-bytes",
        dest="nccl_ras_max_bytes",
        type=int,
        default=nccl_ras.DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help=f"largest report read (default {nccl_ras.DEFAULT_MAX_BYTES})",
    )


def _duration(text: str) -> float:
    try:
        return cards.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_listen_address(value: str) -> tuple[str, int]:
    """'HOST:PORT', '[V6]:PORT' or ':PORT' -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"--web.listen-address {value!r}: expected HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(
            f"--web.listen-address {value!r}: port {port_text!r} is not a number"
        ) from None
    if not 0 <= port <= 65535:
        raise ValueError(f"--web.listen-address {value!r}: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", port


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        daemon = build(args)
    except (ValueError, OSError) as exc:
        print(f"rankscope serve: {exc}", file=sys.stderr)
        return 2
    return daemon.run()


def build(args: argparse.Namespace) -> Daemon:
    """Assemble the daemon from its flags; ValueError/OSError for a flag that cannot work."""
    from rankscope.census.report import census_document
    from rankscope.daemon.app import Daemon, create_app
    from rankscope.daemon.collectors.arenas import ArenasCollector
    from rankscope.daemon.collectors.census import CensusCollector
    from rankscope.daemon.collectors.phases import PhasesCollector
    from rankscope.daemon.collectors.self import SelfCollector
    from rankscope.daemon.flightstate import FlightState, host_pid_resolver
    from rankscope.daemon.otlp import OtlpPusher, default_interval, otlp_configured
    from rankscope.daemon.registry import Collector, TimedCollectors
    from rankscope.daemon.webconfig import (
        ReloadingAuth,
        WebConfig,
        WebConfigMiddleware,
        load_web_config,
    )
    from rankscope.ledger import phases_document

    if not args.flight_dir:
        raise ValueError(f"no flight directory: pass --flight-dir or set {ENV_DIR}")
    flight_dir = Path(args.flight_dir)
    if flight_dir.exists() and not flight_dir.is_dir():
        raise NotADirectoryError(f"--flight-dir {flight_dir} is not a directory")
    if args.phase_boots < 0:
        raise ValueError("--phases.boots must be 0 (every boot) or more")
    host, port = parse_listen_address(args.listen_address)
    web = load_web_config(args.web_config_file) if args.web_config_file else WebConfig()

    state = FlightState(flight_dir)
    monitor = None
    if args.collector_cards or args.collector_holdings:
        monitor = cards.CardMonitor.from_args(args, rank_processes=state.rank_processes)
    collectors: list[Collector] = [
        SelfCollector(state, monitor.up if monitor is not None else None)
    ]
    if args.collector_phases:
        collectors.append(PhasesCollector(state, boots=args.phase_boots))
    if args.collector_arenas:
        collectors.append(ArenasCollector(state))
    if args.collector_census:
        collectors.append(CensusCollector(state))
    if monitor is not None:
        collectors.extend(
            c for c in monitor.collectors() if getattr(args, f"collector_{c.name}", True)
        )
    background = []
    if args.collector_nccl_ras:
        from rankscope.daemon.collectors.nccl_ras import NcclRasCollector
        from rankscope.daemon.nccl_ras import DEFAULT_ADDRESS, Endpoint, RasPoller

        if args.nccl_ras_persist_polls < 1:
            raise ValueError("--collector.nccl-ras.persist-polls must be 1 or more")
        endpoints = [
            Endpoint(
                address,
                persist_polls=args.nccl_ras_persist_polls,
                max_bytes=args.nccl_ras_max_bytes,
                report_timeout=args.nccl_ras_timeout,
            )
            for address in dict.fromkeys(args.nccl_ras_address or [DEFAULT_ADDRESS])
        ]
        poller = RasPoller(endpoints, args.nccl_ras_interval)
        collectors.append(NcclRasCollector(poller, state))
        background.append(poller)
    timed = TimedCollectors(collectors)

    app: Any = create_app(
        registry=timed.registry(),
        state=state,
        cards=monitor,
        phases_report=lambda flight: phases_document(
            flight, host_pid_resolver(getattr(args, "path_procfs", "/proc"))
        ),
        census_report=census_document,
    )
    if web.users or web.headers:
        auth = ReloadingAuth(Path(args.web_config_file), web) if web.users else None
        app = WebConfigMiddleware(app, auth, web.headers)

    otlp = None
    if otlp_configured(args.otlp_endpoint):
        otlp = OtlpPusher(
            timed,
            state.latest_boot,
            endpoint=args.otlp_endpoint,
            interval=args.otlp_interval or default_interval(),
        )
    return Daemon(
        app=app,
        host=host,
        port=port,
        collectors=timed,
        tls=web.tls,
        monitor=monitor,
        otlp=otlp,
        background=tuple(background),
    )
