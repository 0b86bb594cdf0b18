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
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# First, before anything below imports a part of prometheus_client: the serve command
# loads it by parts (no ssl, http.server, urllib.request in the daemon).
import rankscope.daemon.prometheus_parts  # noqa: F401
from rankscope.daemon import cards
from rankscope.daemon.collectors import table
from rankscope.daemon.flags import argtype, parse_bytes, parse_duration
from rankscope.record import ENV_DIR

if TYPE_CHECKING:
    from rankscope.daemon.app import Daemon
    from rankscope.daemon.httpserver import App

log = logging.getLogger("rankscope.daemon")

DEFAULT_PORT = 19400
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
# Every collector that can be switched off (rankscope.daemon.collectors.table).
FLIGHT_COLLECTORS = tuple(e.name for e in table.TABLE if e.switchable and not e.reads_cards)
CARD_COLLECTORS = tuple(e.name for e in table.TABLE if e.switchable and e.reads_cards)


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
    # A value like '-2GiB' is a value (refused by its own parser with a reason), not a flag.
    parser._negative_number_matcher = re.compile(r"^-\d+(\.\d+)?[A-Za-z%]*$")
    parser.add_argument(
        "--flight.dir",
        "--flight-dir",
        dest="flight_dir",
        default=os.environ.get(ENV_DIR),
        metavar="DIR",
        help=f"flight directory the probes write (default ${ENV_DIR})",
    )
    parser.add_argument(
        "--flight.exited-grace",
        dest="exited_grace",
        type=argtype(parse_duration),
        default=None,
        metavar="DURATION",
        help="how long the series of a process that exited stay published (default 5m; "
        "its record file stays, and the API and CLI still show it)",
    )
    parser.add_argument(
        "--flight.read-budget",
        dest="read_budget",
        type=argtype(parse_bytes),
        default=None,
        metavar="BYTES",
        help="read at most this much of the flight directory per refresh (default 4MiB): "
        "a large directory is read over several refreshes, /readyz says 503 until then",
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
        type=argtype(parse_duration),
        default=None,
        metavar="DURATION",
        help="time between OTLP pushes (default OTEL_METRIC_EXPORT_INTERVAL, else 15s)",
    )
    parser.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log only messages at this level or above (default info)",
    )
    table.add_switches(parser)
    cards.add_arguments(parser)
    _add_nccl_ras_arguments(parser)


def _add_nccl_ras_arguments(parser: argparse.ArgumentParser) -> None:
    from rankscope.daemon import nccl_ras

    g = parser.add_argument_group("nccl-ras (NCCL's RAS status reports, docs/census.md)")
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
        type=argtype(parse_duration),
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
        type=argtype(parse_duration),
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
    from rankscope.daemon.app import TLSError

    try:
        daemon = build(args)
        tls = daemon.tls_context()  # a certificate that cannot serve fails here
        sock = daemon.bind()  # and a taken port here, before any "serving on"
    except TLSError as exc:
        print(f"rankscope serve: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"rankscope serve: {exc}", file=sys.stderr)
        return 2
    return daemon.run(tls, sock)


def build(args: argparse.Namespace) -> Daemon:
    """Assemble the daemon from its flags; ValueError/OSError for a flag that cannot work."""
    from rankscope.daemon.app import FLIGHT_REFRESH_S, Daemon, create_app
    from rankscope.daemon.flightstate import EXITED_GRACE_S, READ_BUDGET_BYTES, FlightState
    from rankscope.daemon.nccl_ras import DEFAULT_ADDRESS, Endpoint, RasPoller
    from rankscope.daemon.oom import OomBook
    from rankscope.daemon.otlp import OtlpPusher, default_interval, otlp_configured
    from rankscope.daemon.registry import TimedCollectors
    from rankscope.daemon.sampler import Periodic
    from rankscope.reports.census import census_document
    from rankscope.reports.ledger import phases_document

    if not args.flight_dir:
        raise ValueError(f"no flight directory: pass --flight-dir or set {ENV_DIR}")
    flight_dir = Path(args.flight_dir)
    if flight_dir.exists() and not flight_dir.is_dir():
        raise NotADirectoryError(f"--flight-dir {flight_dir} is not a directory")
    if args.phase_boots < 0:
        raise ValueError("--phases.boots must be 0 (every boot) or more")
    host, port = parse_listen_address(args.listen_address)
    web = None
    if args.web_config_file:  # the web config, and with it ssl (OpenSSL), only when given
        from rankscope.daemon.webconfig import load_web_config

        web = load_web_config(args.web_config_file)

    state = FlightState(
        flight_dir,
        exited_grace=args.exited_grace or EXITED_GRACE_S,
        proc=getattr(args, "path_procfs", "/proc"),
        read_budget=args.read_budget or READ_BUDGET_BYTES,
    )
    monitor = None
    if table.needs_monitor(args):
        monitor = cards.CardMonitor.from_args(args, rank_processes=state.rank_processes)
    ooms = None
    if table.enabled(args, "oom"):
        watch = monitor.exhaustion if monitor is not None else None
        ooms = OomBook(state, watch, getattr(args, "path_procfs", "/proc"))
    background: list[RasPoller] = []
    ras = None
    if table.enabled(args, "nccl-ras"):
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
        ras = RasPoller(endpoints, args.nccl_ras_interval)
        background.append(ras)
    timed = TimedCollectors(
        table.build(table.Inputs(args, state, monitor, ooms, ras)), refresh=state.refresh
    )

    app: App = create_app(
        registry=timed.registry(),
        state=state,
        cards=monitor,
        phases_report=lambda flight: phases_document(flight, state.host_pid),
        census_report=census_document,
        ooms=ooms,
        collecting=timed.running_for,
    )
    if web is not None and (web.users or web.headers):
        from rankscope.daemon.webconfig import ReloadingAuth, WebConfigMiddleware

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
        tls=web.tls if web is not None else None,
        monitor=monitor,
        otlp=otlp,
        refresher=Periodic("rankscope-flight", FLIGHT_REFRESH_S, state.refresh),
        background=tuple(background),
    )
