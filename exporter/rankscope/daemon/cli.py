"""`rankscope serve`: the daemon's flags, parsed once into a DaemonConfig. The default port
19400 is outside the exporters' range on the Prometheus wiki (9100-9999, full since 2023)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.daemon import collectors
from rankscope.daemon.config import (
    DEFAULT_PORT,
    CardsSection,
    DaemonConfig,
    FlightSection,
    OtlpSection,
    WebSection,
)
from rankscope.daemon.flags import (
    argtype,
    parse_duration,
    parse_host_port,
    positive_bytes,
    positive_int,
)
from rankscope.daemon.oom import DEFAULT_EXHAUSTED_BELOW
from rankscope.daemon.sampler import Floors, parse_floor_value, parse_floors
from rankscope.record import ENV_DIR

if TYPE_CHECKING:
    from rankscope.daemon.server import Daemon

DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
# Flags other exporters and servers spell differently: what a wrong one most likely meant.
SYNONYMS = {
    **dict.fromkeys(
        ("--port", "--host", "--bind", "--listen", "--address"), "--web.listen-address"
    ),
    "--dir": "--flight.dir",
    "--config": "--web.config.file",
}


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    add = parser.add_argument
    add("--web.listen-address", dest="listen_address", default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; ':PORT' for every IPv4 "
        "interface, '[::]:PORT' for IPv6)")  # fmt: skip
    add("--web.config.file", dest="web_config_file", default=None, metavar="FILE",
        help="exporter-toolkit web config: TLS, basic auth (bcrypt), response headers")  # fmt: skip
    # A value like '-2GiB' is a value (refused by its own parser with a reason), not a flag.
    parser._negative_number_matcher = re.compile(r"^-\d+(\.\d+)?[A-Za-z%]*$")
    add("--flight.dir", "--flight-dir", dest="flight_dir", default=os.environ.get(ENV_DIR),
        metavar="DIR", help=f"flight directory the probes write (default ${ENV_DIR})")  # fmt: skip
    add("--flight.exited-grace", dest="exited_grace", type=argtype(parse_duration),
        default=FlightSection.exited_grace, metavar="DURATION",
        help="how long the series of a process that exited stay published (default 5m; "
        "its record file stays, and the API and CLI still show it)")  # fmt: skip
    add("--flight.read-budget", dest="read_budget", type=argtype(positive_bytes),
        default=FlightSection.read_budget, metavar="BYTES",
        help="read at most this much of the flight directory per refresh (default 4MiB): "
        "a large directory is read over several refreshes, /readyz says 503 until then")  # fmt: skip
    add("--otlp.endpoint", dest="otlp_endpoint", default=None, metavar="URL",
        help="push the metrics by OTLP/HTTP to this base URL (/v1/metrics is appended); "
        "also on when OTEL_EXPORTER_OTLP_ENDPOINT is set")  # fmt: skip
    add("--otlp.interval", dest="otlp_interval", type=argtype(parse_duration), default=None,
        metavar="DURATION",
        help="time between OTLP pushes (default OTEL_METRIC_EXPORT_INTERVAL, else 15s)")  # fmt: skip
    add("--log.level", dest="log_level", default="info",
        choices=("debug", "info", "warning", "error"),
        help="log only messages at this level or above (default info)")  # fmt: skip
    _add_card_flags(parser)
    for module in collectors.COLLECTORS:  # each switch, then the collector's own flags
        if module.DEFAULT is not None:
            add(f"--collector.{module.NAME}", dest=_switch(module.NAME),
                action=argparse.BooleanOptionalAction, default=module.DEFAULT,
                help=f"the {module.NAME} collector: {module.HELP} "
                f"(default {'on' if module.DEFAULT else 'off'})")  # fmt: skip
        if hasattr(module, "add_flags"):
            module.add_flags(parser)


def _add_card_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument_group("cards (corridor sampler and per-pid holdings)").add_argument
    add("--corridor.floor", dest="corridor_floor", action="append",
        type=argtype(parse_floors), metavar="SPEC",
        help="free-memory floor: '2GiB' for every card, '0=2GiB,GPU-abc=3GiB' per card "
        "index or uuid, '5%%' of the card's total; repeatable. No floor: no breach counting")  # fmt: skip
    add("--sampler.interval", dest="sampler_interval", type=argtype(parse_duration),
        default=CardsSection.interval, metavar="DURATION",
        help="corridor sample interval (default 100ms; 20ms or 10ms for a faster corridor, "
        "docs/corridor.md)")  # fmt: skip
    add("--sampler.window", dest="sampler_window", type=argtype(parse_duration),
        default=CardsSection.window, metavar="DURATION",
        help="trailing window of rankscope_gpu_free_min_bytes (default 15s)")  # fmt: skip
    add("--device.source", dest="device_source", choices=("auto", "nvml", "script"),
        default="auto",
        help="where cards are read: nvml, or a simulated script; auto = the script when "
        "--device.script is given, else nvml (default auto)")  # fmt: skip
    add("--device.script", dest="device_script", metavar="FILE",
        help="JSON file of SIMULATED cards for tests and demos (docs/corridor.md)")  # fmt: skip
    add("--holdings.interval", dest="holdings_interval", type=argtype(parse_duration),
        default=CardsSection.holdings_interval, metavar="DURATION",
        help="how often the per-card process lists are read (default 1s)")  # fmt: skip
    add("--holdings.max-per-card", dest="holdings_max_per_card", type=argtype(positive_int),
        default=CardsSection.max_per_card, metavar="N",
        help="most rankscope_gpu_process_bytes series per card, one of them the overflow "
        "series summing the smallest holders (default 32)")  # fmt: skip
    add("--oom.free-below", dest="oom_free_below", type=argtype(parse_floor_value),
        default=CardsSection.oom_free_below, metavar="SIZE",
        help="a card whose free memory falls to this or less is exhausted: an OOM instant "
        "even where no allocator reports one; its holders are read once at the onset "
        f"('256MiB', or '0.5%%' of the card's total; default {DEFAULT_EXHAUSTED_BELOW})")  # fmt: skip
    add("--path.procfs", dest="path_procfs", default="/proc", metavar="PATH",
        help="procfs mount point with the host's PID view, for matching NVML's pids to "
        "ranks (default /proc)")  # fmt: skip


def _switch(name: str) -> str:
    return f"collector_{name.replace('-', '_')}"


def parse_listen_address(value: str) -> tuple[str, int]:
    return parse_host_port(value, "--web.listen-address", any_host="0.0.0.0")


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    """The parsed flags as the daemon's config; ValueError/OSError for one that cannot work."""
    if not args.flight_dir:
        raise ValueError(f"no flight directory: pass --flight-dir or set {ENV_DIR}")
    flight_dir = Path(args.flight_dir)
    if flight_dir.exists() and not flight_dir.is_dir():
        raise NotADirectoryError(f"--flight-dir {flight_dir} is not a directory")
    return DaemonConfig(
        flight=FlightSection(flight_dir, args.exited_grace, args.read_budget),
        web=WebSection(
            *parse_listen_address(args.listen_address),
            config_file=Path(args.web_config_file) if args.web_config_file else None,
        ),
        cards=CardsSection(
            floors=functools.reduce(Floors.merged, args.corridor_floor or (), Floors()),
            interval=args.sampler_interval,
            window=args.sampler_window,
            device_source=args.device_source,
            device_script=args.device_script,
            holdings_interval=args.holdings_interval,
            max_per_card=args.holdings_max_per_card,
            oom_free_below=args.oom_free_below,
        ),
        otlp=OtlpSection(args.otlp_endpoint, args.otlp_interval),
        procfs=args.path_procfs,
        log_level=args.log_level,
        collectors=frozenset(
            m.NAME for m in collectors.COLLECTORS if getattr(args, _switch(m.NAME), True)
        ),
        options={
            m.Options: _options(m.Options, args)
            for m in collectors.COLLECTORS
            if hasattr(m, "Options")
        },
    )


def _options(kind: type[Any], args: argparse.Namespace) -> Any:
    """A collector's Options from its flags (a repeated flag's list as a tuple)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(kind)}
    return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def build(args: argparse.Namespace) -> Daemon:
    """The daemon assembled from its flags."""
    from rankscope.daemon.server import build as build_daemon

    return build_daemon(config_from_args(args))


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # uvicorn's own lines (its start and stop, each refused request) only at debug: the daemon
    # logs its own, and a flood of bad requests must not flood the log.
    logging.getLogger("uvicorn").setLevel("DEBUG" if args.log_level == "debug" else "ERROR")
    import ssl

    from rankscope.daemon.server import listen

    try:
        daemon = build(args)  # a certificate that cannot serve fails here
        sock = listen(daemon.host, daemon.port)  # and a taken port here, before "serving on"
    except ssl.SSLError as exc:
        print(f"rankscope serve: TLS: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"rankscope serve: {exc}", file=sys.stderr)
        return 2
    return daemon.run(sock)
