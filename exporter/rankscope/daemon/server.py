"""The daemon assembled from its config (sources, collectors, app, web config, OTLP), and
its run until a signal."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rankscope.daemon import collectors
from rankscope.daemon.app import create_app
from rankscope.daemon.config import DaemonConfig
from rankscope.daemon.httpserver import App, Server, listen
from rankscope.daemon.registry import TimedCollectors
from rankscope.daemon.sources import Poller, Sources
from rankscope.reports.census import census_document
from rankscope.reports.ledger import phases_document

if TYPE_CHECKING:  # ssl and the web config load only when a web config is given
    import ssl

    from rankscope.daemon.webconfig import TLSConfig

log = logging.getLogger("rankscope.daemon")


class TLSError(ValueError):
    """A certificate and key that cannot serve together."""


def build(config: DaemonConfig) -> Daemon:
    """ValueError/OSError for a config that cannot work."""
    sources = Sources(config)
    enabled = [m for m in collectors.COLLECTORS if config.enabled(m.NAME, m.DEFAULT)]
    timed = TimedCollectors([m.build(config, sources) for m in enabled], sources.flight.refresh)
    state = sources.flight
    app: App = create_app(
        registry=timed.registry(),
        state=state,
        cards=sources.card_sampler,
        phases_report=lambda flight: phases_document(flight, state.host_pid),
        census_report=census_document,
        ooms=sources.oom_book,
        collecting=timed.running_for,
    )
    tls = None
    if config.web.config_file is not None:  # the web config, and with it ssl, only when given
        from rankscope.daemon.webconfig import with_web_config

        app, tls = with_web_config(app, config.web.config_file)
    otlp = _otlp(config, timed, state.latest_boot)
    return Daemon(app, config.web.host, config.web.port, timed, sources, tls, otlp)


def _otlp(config: DaemonConfig, timed: TimedCollectors, latest_boot: Any) -> Poller | None:
    from rankscope.daemon.otlp import OtlpPusher, default_interval, otlp_configured

    if not otlp_configured(config.otlp.endpoint):
        return None
    interval = config.otlp.interval or default_interval()
    return OtlpPusher(timed, latest_boot, endpoint=config.otlp.endpoint, interval=interval)


@dataclass
class Daemon:
    app: App
    host: str
    port: int
    collectors: TimedCollectors
    sources: Sources
    tls: TLSConfig | None = None
    otlp: Poller | None = None

    def tls_context(self) -> ssl.SSLContext | None:
        """The web config's TLS context (None without); TLSError naming unusable files."""
        if self.tls is None:
            return None
        import ssl

        try:
            context = self.tls.context()
        except ssl.SSLError as exc:
            raise TLSError(
                f"TLS: cannot use certificate {self.tls.cert_file} with key "
                f"{self.tls.key_file}: {exc.reason or exc}"
            ) from None
        expired = self.tls.expired(time.time())
        if expired:
            log.warning(
                "TLS certificate %s expired on %s; serving it anyway, clients will refuse it",
                self.tls.cert_file,
                expired,
            )
        return context

    def bind(self) -> socket.socket:
        """The listening socket: a taken port is an OSError here, before the log line."""
        return listen(self.host, self.port)

    def run(self, tls: ssl.SSLContext | None, sock: socket.socket) -> int:
        """Serve until SIGTERM or SIGINT; then stop serving, stop the threads, and end by
        the signal as a process without handlers would (SIGINT: KeyboardInterrupt)."""
        stop = threading.Event()
        caught: list[int] = []

        def on_signal(signum: int, _frame: Any) -> None:
            caught.append(signum)
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        self.sources.start()
        try:
            if self.otlp is not None:
                self.otlp.start()
            server = Server(sock, self.app, tls)
            server.start()
            try:
                log.info("rankscope serving on %s/metrics", server.url)
                while not stop.wait(1.0):
                    pass
            finally:
                server.stop()
        finally:
            sock.close()
            if self.otlp is not None:
                self.otlp.stop()
            self.sources.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for signum in caught[:1]:
            signal.raise_signal(signum)
        return 0
