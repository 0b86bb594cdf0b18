"""The daemon assembled from its config (sources, collectors, app, web config, OTLP), and
its run on uvicorn until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from rankscope.daemon import collectors
from rankscope.daemon.app import create_app
from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.guard import HEAD_DEADLINE_S, RequestGuard, StrictH11Protocol
from rankscope.daemon.otlp import OtlpPusher, default_interval, otlp_configured
from rankscope.daemon.registry import TimedCollectors
from rankscope.daemon.sources import Sources

log = logging.getLogger("rankscope.daemon")


def build(config: DaemonConfig) -> Daemon:
    """ValueError/OSError for a config that cannot work (ssl.SSLError for TLS files)."""
    sources = Sources(config)
    enabled = [m for m in collectors.COLLECTORS if config.enabled(m.NAME, m.DEFAULT)]
    timed = TimedCollectors([m.build(config, sources) for m in enabled], sources.flight.refresh)
    app: Any = create_app(
        registry=timed.registry(),
        state=sources.flight,
        cards=sources.card_sampler,
        ooms=sources.oom_book,
        collecting=timed.running_for,
    )
    tls = None
    if config.web.config_file is not None:  # the web config, and with it yaml, only when given
        from rankscope.daemon.webauth import WebAuth

        app = WebAuth(app, config.web.config_file)
        tls = app.tls_context()
    if otlp_configured(config.otlp.endpoint):
        interval = config.otlp.interval or default_interval()
        pusher = OtlpPusher(
            timed, sources.flight.latest_boot, endpoint=config.otlp.endpoint, interval=interval
        )
        sources.pollers.append(pusher)  # started after the sources, stopped before them
    return Daemon(app, config.web.host, config.web.port, timed, sources, tls)


@dataclass
class Daemon:
    app: Any  # an ASGI app
    host: str
    port: int
    collectors: TimedCollectors
    sources: Sources
    tls: ssl.SSLContext | None = None  # the web config's: each connection gets the one in force

    def run(self, sock: socket.socket) -> int:
        """Serve on ``sock`` until SIGTERM or SIGINT; then stop serving, stop the threads, and
        end by the signal as a process without handlers would (SIGINT: KeyboardInterrupt)."""
        server = HTTPServer(self.app, self.tls)
        caught: list[int] = []

        def on_signal(signum: int, _frame: Any) -> None:
            caught.append(signum)
            server.should_exit = True

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        # What start-up made (FastAPI's and pydantic's objects among it) lives as long as the
        # process: kept out of the garbage collector's full passes, which otherwise walk it
        # (30-60 ms a pass on the dev VM, in the middle of a scrape; 1 ms frozen).
        gc.freeze()
        self.sources.start()
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
            self.sources.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for signum in caught[:1]:
            signal.raise_signal(signum)
        return 0


KEEP_ALIVE_S = 30  # an idle kept-alive connection is closed after this
STOP_GRACE_S = 5  # how long a stop waits for the answers in flight


class HTTPServer(uvicorn.Server):
    """uvicorn serving an app on sockets the caller bound; the caller handles signals."""

    def __init__(self, app: Any, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(
            uvicorn.Config(
                RequestGuard(app),
                http=StrictH11Protocol,
                loop="asyncio",
                lifespan="off",
                ws="none",
                interface="asgi3",
                log_config=None,  # the daemon's logging, as configured by `rankscope serve`
                access_log=False,  # RequestGuard logs each answer at debug, escaped
                server_header=False,  # no version advertised
                timeout_keep_alive=KEEP_ALIVE_S,
                timeout_graceful_shutdown=STOP_GRACE_S,
            )
        )
        self.tls = tls  # rankscope's own context: uvicorn's would take file names only
        self.address: tuple[str, int] = ("", 0)  # the host and port it listens on, once started
        self.url = ""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # Daemon.run has its own handlers, which set should_exit

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start on the caller's sockets (lifespan is off), with a TLS handshake
        held to a request head's deadline (asyncio's default is 60 s)."""
        config = self.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        loop = asyncio.get_running_loop()
        handshake = HEAD_DEADLINE_S if self.tls is not None else None
        self.servers = [
            await loop.create_server(
                protocol, sock=sock, ssl=self.tls, backlog=config.backlog,
                ssl_handshake_timeout=handshake,
            )
            for sock in sockets or ()
        ]  # fmt: skip
        if sockets:
            host, port = self.address = sockets[0].getsockname()[:2]
            host = f"[{host}]" if ":" in host else host
            scheme = "https" if self.tls is not None else "http"
            self.url = f"{scheme}://{host}:{port}"
            log.info("rankscope serving on %s/metrics", self.url)
        self.started = True  # last: a caller waiting on it reads the address next


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port``, not listening yet; OSError naming a taken one."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


@contextlib.contextmanager
def serving(app: Any) -> Iterator[HTTPServer]:
    """``app`` served on a thread on a free loopback port until the block ends; for tests and
    benches, as the daemon serves it."""
    server = HTTPServer(app)
    sock = listen("127.0.0.1", 0)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="rankscope-http", daemon=True
    )
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(STOP_GRACE_S + 5)
