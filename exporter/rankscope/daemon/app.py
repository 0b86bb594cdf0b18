"""The daemon's HTTP side: /metrics, /healthz, /readyz, the JSON API, the status page."""

from __future__ import annotations

import gzip
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.registry import CollectorRegistry

from rankscope import __version__
from rankscope.daemon.exposition import choose_encoder
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.httpserver import (
    App,
    HTTPError,
    Request,
    Response,
    Router,
    Server,
    json_response,
    listen,
    query_int,
    static_files,
    text,
)
from rankscope.daemon.paging import DEFAULT_LIMIT, MAX_LIMIT, paginate
from rankscope.daemon.registry import TimedCollectors
from rankscope.record.reader import BootNotFoundError, Flight

if TYPE_CHECKING:  # ssl and the web config load only when a web config is given
    import ssl

    from rankscope.daemon.webconfig import TLSConfig

log = logging.getLogger("rankscope.daemon")

# Prometheus's default scrape timeout: a collection running longer is stuck, not slow.
STUCK_SCRAPE_SECONDS = 10.0

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

LINKS = (
    ("/metrics", "Prometheus metrics"),
    ("/healthz", "liveness"),
    ("/readyz", "readiness"),
    ("/api/v1/boots", "boots in the flight directory"),
    ("/api/v1/phases", "posts between phases, latest boot"),
    ("/api/v1/census", "collective census, latest boot"),
    ("/api/v1/cards", "cards, corridor and holdings"),
    ("/api/v1/oom", "OOM instants and who held the card"),
)


class CardSource(Protocol):
    """What the app needs of the card monitor (rankscope.daemon.cards.CardMonitor)."""

    def cards_json(self) -> dict[str, Any]: ...

    def up(self) -> dict[str, bool]: ...

    def ready(self) -> bool: ...


class OomSource(Protocol):
    """What the app needs of the OOM book (rankscope.daemon.oom.OomBook)."""

    def documents(self) -> list[dict[str, Any]]: ...

    def latest_by_uuid(self) -> dict[str, dict[str, Any]]: ...


# A report function turns the records of one boot into what the CLI's --json prints.
Report = Callable[[Flight], dict[str, Any]]

# The daemon's refresher tails the flight directory every FLIGHT_REFRESH_S; the API answers
# from that state, and refreshes it itself only when it is older than API_REFRESH_S (no
# refresher running, as in an app built without the daemon).
FLIGHT_REFRESH_S = 1.0
API_REFRESH_S = 2 * FLIGHT_REFRESH_S


def create_app(
    *,
    registry: CollectorRegistry,
    state: FlightState,
    phases_report: Report,
    census_report: Report,
    cards: CardSource | None = None,
    ooms: OomSource | None = None,
    static_dir: Path = STATIC_DIR,
    collecting: Callable[[], float | None] | None = None,
) -> Router:
    app = Router()

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        # Each request has its own thread, so a slow collector holds up no other request.
        # The encoders: client_python's OpenMetrics, its text format (rankscope.daemon.exposition).
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(registry)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return Response(200, body, content_type, headers)

    @app.get("/healthz")
    def healthz(request: Request) -> Response:
        return text("ok\n")

    @app.get("/readyz")
    def readyz(request: Request) -> Response:
        problems: list[str] = []
        if state.up is None:
            state.refresh()
        if not state.up:
            problems.append(f"flight directory {state.flight_dir}: {state.error}")
        elif state.backlog:
            problems.append(
                f"catching up: {state.backlog / 2**20:.1f} MiB of flight directory "
                f"{state.flight_dir} left to read"
            )
        if cards is not None and not cards.ready():
            problems.append("the device source has not been tried yet")
        running = collecting() if collecting is not None else None
        if running is not None and running > STUCK_SCRAPE_SECONDS:
            problems.append(f"a scrape has been collecting for {running:.0f}s")
        body = {"ready": not problems, "problems": problems}
        return json_response(body, status=200 if not problems else 503)

    @app.get("/api/v1/boots")
    def boots(request: Request) -> Response:
        _fresh(state)
        return json_response({"boots": [b.as_json() for b in state.boots()]})

    @app.get("/api/v1/phases")
    def phases(request: Request) -> Response:
        offset, limit = _page(request)
        doc = phases_report(_flight(state, request.args().get("boot")))
        return json_response(paginate(doc, PHASES_LISTS, offset, limit, _next_page(request, limit)))

    @app.get("/api/v1/census")
    def census(request: Request) -> Response:
        offset, limit = _page(request)
        doc = census_report(_flight(state, request.args().get("boot")))
        return json_response(paginate(doc, CENSUS_LISTS, offset, limit, _next_page(request, limit)))

    @app.get("/api/v1/cards")
    def cards_api(request: Request) -> Response:
        if cards is None:
            return json_response({"cards": [], "why": "the card monitor is not running"})
        body = cards.cards_json()
        latest = ooms.latest_by_uuid() if ooms is not None else {}
        for card in body["cards"]:
            card["last_oom"] = latest.get(card["uuid"])
        return json_response(body)

    @app.get("/api/v1/oom")
    def oom_api(request: Request) -> Response:
        offset, limit = _page(request)
        doc: dict[str, Any] = (
            {"ooms": ooms.documents()}
            if ooms is not None
            else {"ooms": [], "why": "the oom collector is off"}
        )
        return json_response(paginate(doc, ("ooms",), offset, limit, _next_page(request, limit)))

    index = static_dir / "index.html"
    if static_dir.is_dir():
        app.mount("/static", static_files(static_dir, "/static"))

    @app.get("/")
    def landing(request: Request) -> Response:
        if index.is_file():
            return text(with_links(index.read_text(encoding="utf-8")), content_type="text/html")
        return text(landing_page(), content_type="text/html")

    return app


# The long lists of each answer, paged by ?offset= and ?limit= (docs/architecture.md, API).
PHASES_LISTS = ("processes",)
CENSUS_LISTS = ("ranks", "entries", "history", "in_process")


def _page(request: Request) -> tuple[int, int]:
    """(offset, limit) of a paged request; 422 naming a bad one."""
    offset = query_int(request, "offset", 0, ge=0)
    limit = query_int(request, "limit", DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    return offset, limit


def _next_page(request: Request, limit: int) -> Callable[[int], str]:
    def url(offset: int) -> str:
        return request.url_with(offset=offset, limit=limit)

    return url


def _fresh(state: FlightState) -> None:
    """The state as of at most API_REFRESH_S ago; 503 when the directory cannot be read (a
    directory no job has written yet is empty, not an error)."""
    state.refresh_if_older(API_REFRESH_S)
    if state.up is False:
        raise HTTPError(503, f"flight directory {state.flight_dir}: {state.error}")


def _flight(state: FlightState, boot: str | None) -> Flight:
    _fresh(state)
    try:
        return state.flight(boot)
    except BootNotFoundError as exc:
        raise HTTPError(404, str(exc)) from exc


def escape(text: str) -> str:
    """html.escape (quotes included) without the html module, whose entity table cost the
    daemon 0.3 MiB of resident memory."""
    for char, entity in (
        ("&", "&amp;"),
        ("<", "&lt;"),
        (">", "&gt;"),
        ('"', "&quot;"),
        ("'", "&#x27;"),
    ):
        text = text.replace(char, entity)
    return text


def _link_items(links: tuple[tuple[str, str], ...]) -> str:
    # Relative hrefs, so the page works behind a proxy that serves it under a path prefix.
    return "\n".join(
        f'    <li><a href="{href.lstrip("/")}">{escape(href)}</a> {escape(what)}</li>'
        for href, what in links
    )


def with_links(page: str) -> str:
    """The status page with every landing link on it: those it lacks are added at the end."""
    missing = tuple(
        (href, what)
        for href, what in LINKS
        if f'href="{href}"' not in page and f'href="{href.lstrip("/")}"' not in page
    )
    if not missing:
        return page
    nav = f'<nav class="endpoints">\n  <ul>\n{_link_items(missing)}\n  </ul>\n</nav>\n'
    at = page.lower().rfind("</body>")
    return page[:at] + nav + page[at:] if at >= 0 else page + nav


def landing_page() -> str:
    items = _link_items(LINKS)
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>rankscope</title></head>\n"
        f"<body>\n  <h1>rankscope {escape(__version__)}</h1>\n  <ul>\n{items}\n  </ul>\n"
        "</body></html>\n"
    )


class Monitor(CardSource, Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


class Pusher(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class Daemon:
    """The assembled daemon: the app on the standard library's HTTP server, plus the card
    monitor, the refresher and the pushers it starts before serving and stops after."""

    app: App
    host: str
    port: int
    collectors: TimedCollectors
    tls: TLSConfig | None = None
    monitor: Monitor | None = None
    otlp: Pusher | None = None
    refresher: Pusher | None = None  # keeps the flight state current for the API
    background: tuple[Pusher, ...] = ()  # pollers with their own threads (nccl-ras)

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of the web config, None without TLS; TLSError naming the files
        for a certificate and key that cannot be loaded together (a key not matching its
        certificate, say)."""
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
        """The listening socket, bound before anything says it serves: a taken port is an
        OSError here, at start-up, not after the log line."""
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
        if self.refresher is not None:
            self.refresher.start()
        if self.monitor is not None:
            self.monitor.start()
        try:
            if self.otlp is not None:
                self.otlp.start()
            for poller in self.background:
                poller.start()
            server = Server(sock, self.app, tls)
            server.start()
            try:
                log.info("rankscope serving on %s/metrics", server.url)
                while not stop.wait(1.0):
                    pass
            finally:
                server.stop()
        finally:
            for poller in self.background:
                poller.stop()
            sock.close()
            if self.otlp is not None:
                self.otlp.stop()
            if self.monitor is not None:
                self.monitor.stop()
            if self.refresher is not None:
                self.refresher.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for signum in caught[:1]:
            signal.raise_signal(signum)
        return 0


class TLSError(ValueError):
    """A certificate and key that cannot serve together."""
