"""The daemon's HTTP side: /metrics, /healthz, /readyz, the JSON API, the status page."""

from __future__ import annotations

import gzip
import html
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from rankscope import __version__
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.paging import DEFAULT_LIMIT, MAX_LIMIT, paginate
from rankscope.daemon.registry import TimedCollectors
from rankscope.daemon.webconfig import TLSConfig
from rankscope.flight import BootNotFoundError, Flight

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
) -> FastAPI:
    app = FastAPI(title="rankscope", version=__version__, docs_url=None, redoc_url=None)

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        # Sync handler: FastAPI runs it in a worker thread, so a slow collector never
        # stalls the event loop. The encoders are client_python's (text or OpenMetrics).
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(registry)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type=content_type, headers=headers)

    @app.get("/healthz")
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.get("/readyz")
    def readyz() -> JSONResponse:
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
        return JSONResponse(body, status_code=200 if not problems else 503)

    @app.get("/api/v1/boots")
    def boots() -> dict[str, Any]:
        _fresh(state)
        return {"boots": [b.as_json() for b in state.boots()]}

    @app.get("/api/v1/phases")
    def phases(
        request: Request, boot: str | None = None, offset: Offset = 0, limit: Limit = DEFAULT_LIMIT
    ) -> dict[str, Any]:
        doc = phases_report(_flight(state, boot))
        return paginate(doc, PHASES_LISTS, offset, limit, _next_page(request, limit))

    @app.get("/api/v1/census")
    def census(
        request: Request, boot: str | None = None, offset: Offset = 0, limit: Limit = DEFAULT_LIMIT
    ) -> dict[str, Any]:
        doc = census_report(_flight(state, boot))
        return paginate(doc, CENSUS_LISTS, offset, limit, _next_page(request, limit))

    @app.get("/api/v1/cards")
    def cards_api() -> dict[str, Any]:
        if cards is None:
            return {"cards": [], "why": "the card monitor is not running"}
        body = cards.cards_json()
        latest = ooms.latest_by_uuid() if ooms is not None else {}
        for card in body["cards"]:
            card["last_oom"] = latest.get(card["uuid"])
        return body

    @app.get("/api/v1/oom")
    def oom_api(
        request: Request, offset: Offset = 0, limit: Limit = DEFAULT_LIMIT
    ) -> dict[str, Any]:
        doc: dict[str, Any] = (
            {"ooms": ooms.documents()}
            if ooms is not None
            else {"ooms": [], "why": "the oom collector is off"}
        )
        return paginate(doc, ("ooms",), offset, limit, _next_page(request, limit))

    index = static_dir / "index.html"
    if static_dir.is_dir():
        app.mount("/static", StaticFiles(directory=static_dir), name="static")

    @app.get("/", response_model=None)
    def landing() -> Response:
        if index.is_file():
            return HTMLResponse(with_links(index.read_text(encoding="utf-8")))
        return HTMLResponse(landing_page())

    return app


# The long lists of each answer, paged by ?offset= and ?limit= (docs/architecture.md, API).
PHASES_LISTS = ("processes",)
CENSUS_LISTS = ("ranks", "entries", "history", "in_process")
Offset = Annotated[int, Query(ge=0)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]


def _next_page(request: Request, limit: int) -> Callable[[int], str]:
    def url(offset: int) -> str:
        query = request.url.include_query_params(offset=offset, limit=limit).query
        return f"{request.url.path}?{query}"

    return url


def _fresh(state: FlightState) -> None:
    """The state as of at most API_REFRESH_S ago; 503 when the directory cannot be read (a
    directory no job has written yet is empty, not an error)."""
    state.refresh_if_older(API_REFRESH_S)
    if state.up is False:
        raise HTTPException(503, f"flight directory {state.flight_dir}: {state.error}")


def _flight(state: FlightState, boot: str | None) -> Flight:
    _fresh(state)
    try:
        return state.flight(boot)
    except BootNotFoundError as exc:
        raise HTTPException(404, str(exc)) from exc


def _link_items(links: tuple[tuple[str, str], ...]) -> str:
    # Relative hrefs, so the page works behind a proxy that serves it under a path prefix.
    return "\n".join(
        f'    <li><a href="{href.lstrip("/")}">{html.escape(href)}</a> {html.escape(what)}</li>'
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
        f"<body>\n  <h1>rankscope {html.escape(__version__)}</h1>\n  <ul>\n{items}\n  </ul>\n"
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
    """The assembled daemon: the ASGI app on uvicorn, plus the card monitor and the OTLP
    pusher it starts before serving and stops after."""

    app: Any
    host: str
    port: int
    collectors: TimedCollectors
    tls: TLSConfig | None = None
    monitor: Monitor | None = None
    otlp: Pusher | None = None
    refresher: Pusher | None = None  # keeps the flight state current for the API
    background: tuple[Pusher, ...] = ()  # pollers with their own threads (nccl-ras)

    def server(self) -> uvicorn.Server:
        """The uvicorn server; ValueError naming the files for a certificate and key that
        cannot be loaded together (a key not matching its certificate, say)."""
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {
                "ssl_certfile": str(self.tls.cert_file),
                "ssl_keyfile": str(self.tls.key_file),
                "ssl_cert_reqs": self.tls.cert_reqs,
                "ssl_ca_certs": str(self.tls.client_ca_file) if self.tls.client_ca_file else None,
            }
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            access_log=False,
            log_config=None,  # the daemon's logging.basicConfig applies
            server_header=False,
            **tls,
        )
        try:
            config.load()
        except ssl.SSLError as exc:
            assert self.tls is not None
            raise TLSError(
                f"TLS: cannot use certificate {self.tls.cert_file} with key "
                f"{self.tls.key_file}: {exc.reason or exc}"
            ) from None
        if self.tls is not None and config.ssl is not None:
            self.tls.apply(config.ssl)
            expired = self.tls.expired(time.time())
            if expired:
                log.warning(
                    "TLS certificate %s expired on %s; serving it anyway, clients will refuse it",
                    self.tls.cert_file,
                    expired,
                )
        return uvicorn.Server(config)

    def bind(self) -> socket.socket:
        """The listening socket, bound before anything says it serves: a taken port is an
        OSError here, at start-up, not after the log line."""
        family, kind, proto, _, address = socket.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except OSError as exc:
            sock.close()
            raise OSError(
                f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        return sock

    def run(self, server: uvicorn.Server, sock: socket.socket) -> int:
        if self.refresher is not None:
            self.refresher.start()
        if self.monitor is not None:
            self.monitor.start()
        try:
            if self.otlp is not None:
                self.otlp.start()
            for poller in self.background:
                poller.start()
            scheme = "https" if self.tls is not None else "http"
            host, port = sock.getsockname()[:2]
            log.info("rankscope serving on %s://%s:%d/metrics", scheme, host, port)
            server.run(sockets=[sock])
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
        return 0 if server.started else 1


class TLSError(ValueError):
    """A certificate and key that cannot serve together."""
