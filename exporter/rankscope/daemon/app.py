"""The daemon's HTTP side on FastAPI: /metrics, /healthz, /readyz, the JSON API, the status
page."""

from __future__ import annotations

import functools
import gzip
import html
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import CollectorRegistry

from rankscope import __version__
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.oom import OomBook, OomInstant, instant_json
from rankscope.daemon.paging import DEFAULT_LIMIT, MAX_LIMIT, paginate
from rankscope.daemon.sampler import CardView, Sampler
from rankscope.daemon.sources import FLIGHT_REFRESH_S
from rankscope.record.reader import BootNotFoundError, Flight
from rankscope.reports.census import census_document
from rankscope.reports.ledger import phases_document

# Prometheus's default scrape timeout: a collection running longer is stuck, not slow.
STUCK_SCRAPE_SECONDS = 10.0
# The API refreshes the flight state itself only when older (no refresher running).
API_REFRESH_S = 2 * FLIGHT_REFRESH_S
# An error answer echoes at most this much of what the client sent.
ECHO_BYTES = 200

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

Offset = Annotated[int, Query(ge=0)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]


def create_app(
    *,
    registry: CollectorRegistry,
    state: FlightState,
    cards: Sampler | None = None,
    ooms: OomBook | None = None,
    static_dir: Path = STATIC_DIR,
    collecting: Callable[[], float | None] | None = None,
) -> FastAPI:
    # No generated docs: the API is documented in docs/architecture.md, and /docs would
    # load its script from a CDN.
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    app.add_exception_handler(RequestValidationError, _clipped_validation_error)  # type: ignore[arg-type]
    # Routes are plain functions: FastAPI runs each on its thread pool, so a slow collector
    # or a large flight directory never holds up the event loop.
    get = functools.partial(app.api_route, methods=["GET", "HEAD"])

    @get("/metrics")
    def metrics(request: Request) -> Response:
        return _exposition(registry, request)

    @get("/healthz")
    def healthz() -> Response:
        return PlainTextResponse("ok\n")

    @get("/readyz")
    def readyz() -> Response:
        return _readiness(state, cards, collecting)

    @get("/api/v1/boots")
    def boots() -> Response:
        _fresh(state)
        return JSONResponse({"boots": [b.as_json() for b in state.boots()]})

    @get("/api/v1/phases")
    def phases(
        request: Request, boot: str | None = None, offset: Offset = 0, limit: Limit = DEFAULT_LIMIT
    ) -> Response:
        doc = phases_document(_flight(state, boot), state.host_pid)
        return _paged(request, doc, ("processes",), offset, limit)

    @get("/api/v1/census")
    def census(
        request: Request, boot: str | None = None, offset: Offset = 0, limit: Limit = DEFAULT_LIMIT
    ) -> Response:
        doc = census_document(_flight(state, boot))
        return _paged(request, doc, ("ranks", "entries", "history", "in_process"), offset, limit)

    @get("/api/v1/cards")
    def cards_route() -> Response:
        return JSONResponse(cards_document(cards, ooms))

    @get("/api/v1/oom")
    def oom(request: Request, offset: Offset = 0, limit: Limit = DEFAULT_LIMIT) -> Response:
        if ooms is None:
            doc: dict[str, Any] = {"ooms": [], "why": "the oom collector is off"}
        else:
            doc = {"ooms": [instant_json(i) for i in ooms.instants()]}
        return _paged(request, doc, ("ooms",), offset, limit)

    if static_dir.is_dir():
        app.mount("/static", StaticFiles(directory=static_dir), name="static")
    index = static_dir / "index.html"

    @get("/")
    def landing() -> Response:
        page = with_links(index.read_text(encoding="utf-8")) if index.is_file() else landing_page()
        return HTMLResponse(page)

    return app


def _exposition(registry: CollectorRegistry, request: Request) -> Response:
    """client_python's exposition in the format the Accept header asks for, gzipped when
    the client takes it."""
    try:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    except (TypeError, ValueError):  # client_python's parse of a version that is no number
        encoder, content_type = choose_encoder("")
    body = encoder(registry)
    headers = {"Vary": "Accept, Accept-Encoding"}
    if gzip_accepted(request.headers.get("accept-encoding", "")):
        # Level 1: a tenth of level 6's time (285 KB: 0.6 ms against 2-7 ms on the dev VM)
        # for a body a fifth larger (20 KB against 16 KB); Prometheus takes any level.
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return Response(body, media_type=content_type, headers=headers)


def _readiness(
    state: FlightState, cards: Sampler | None, collecting: Callable[[], float | None] | None
) -> Response:
    problems: list[str] = []
    if state.up is None:
        state.refresh()
    flight = state.health()
    if flight.directory_error is not None:
        problems.append(f"flight directory {state.flight_dir}: {flight.directory_error}")
    elif flight.backlog:
        problems.append(
            f"catching up: {flight.backlog / 2**20:.1f} MiB of flight directory "
            f"{state.flight_dir} left to read"
        )
    if cards is not None and not cards.tried.is_set():
        problems.append("the device source has not been tried yet")
    running = collecting() if collecting is not None else None
    if running is not None and running > STUCK_SCRAPE_SECONDS:
        problems.append(f"a scrape has been collecting for {running:.0f}s")
    body = {"ready": not problems, "problems": problems, "flight": flight.as_json()}
    return JSONResponse(body, status_code=200 if not problems else 503)


def _paged(
    request: Request, doc: dict[str, Any], lists: tuple[str, ...], offset: int, limit: int
) -> Response:
    """``doc`` with its long ``lists`` paged by ?offset= and ?limit= (docs/architecture.md)."""
    return JSONResponse(paginate(doc, lists, offset, limit, request.url.path, request.url.query))


def clip(text: str) -> str:
    """At most ECHO_BYTES bytes (UTF-8) of a client's text, marked when cut."""
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= ECHO_BYTES:
        return text
    return raw[:ECHO_BYTES].decode("utf-8", "ignore") + "..."


async def _clipped_validation_error(request: Request, exc: RequestValidationError) -> Response:
    """FastAPI's 422, with each echoed input cut to ECHO_BYTES."""
    errors = [{k: v for k, v in error.items() if k != "ctx"} for error in exc.errors()]
    for error in errors:
        if isinstance(error.get("input"), str):
            error["input"] = clip(error["input"])
    return JSONResponse({"detail": errors}, status_code=422)


def cards_document(cards: Sampler | None, ooms: OomBook | None = None) -> dict[str, Any]:
    """GET /api/v1/cards (docs/architecture.md): every process listed (the metric is capped,
    this is not), and each card's latest OOM."""
    if cards is None:
        return {"cards": [], "why": "the card monitor is not running"}
    failing = cards.source_failing
    why = f"device source {cards.source.name} is down: {failing}" if failing else None
    if why is None and not cards.tried.is_set():
        why = "the device source has not been tried yet"
    latest = ooms.latest_by_card() if ooms is not None else {}
    return {"cards": [_card(v, latest.get(v.identity.uuid)) for v in cards.views()], "why": why}


def _card(v: CardView, last_oom: OomInstant | None) -> dict[str, Any]:
    held = v.holdings
    return {
        "gpu": v.identity.index,
        "uuid": v.identity.uuid,
        "model": v.identity.model,
        "source": v.source,
        "total": v.identity.total,
        "free": v.free,
        "free_min": v.free_min,
        "floor": v.floor,
        "margin": v.margin,
        "breach_seconds": v.breach_seconds,
        "breaches": v.breaches,
        # No holdings read yet: each of these unmeasured (None).
        **{k: getattr(held, k, None) for k in ("rank_resident", "foreign", "unattributed")},
        "processes": [h.as_json() for h in (held.processes if held else ())],
        "last_oom": instant_json(last_oom) if last_oom is not None else None,
    }


def _fresh(state: FlightState) -> None:
    """The state as of at most API_REFRESH_S ago; 503 when the directory cannot be read (a
    directory no job has written yet is empty, not an error)."""
    state.refresh_if_older(API_REFRESH_S)
    if state.up is False:
        raise HTTPException(503, f"flight directory {state.flight_dir}: {state.error}")


def _flight(state: FlightState, boot: str | None) -> Flight:
    """The boot ?boot= names (the latest by default); 404 for one the state lacks."""
    _fresh(state)
    try:
        return state.flight(boot)
    except BootNotFoundError as exc:
        raise HTTPException(404, clip(str(exc))) from exc


def with_links(page: str) -> str:
    """The status page with every landing link on it: those it lacks are added at the end,
    relative, so the page works behind a proxy that serves it under a path prefix."""
    items = [
        f'    <li><a href="{href.lstrip("/")}">{html.escape(href)}</a> {html.escape(what)}</li>\n'
        for href, what in LINKS
        if f'href="{href}"' not in page and f'href="{href.lstrip("/")}"' not in page
    ]
    if not items:
        return page
    nav = f'<nav class="endpoints">\n  <ul>\n{"".join(items)}  </ul>\n</nav>\n'
    at = page.lower().rfind("</body>")
    return page[:at] + nav + page[at:] if at >= 0 else page + nav


def landing_page() -> str:
    """The page served where the status page is not installed."""
    return with_links(
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>rankscope</title></head>\n"
        f"<body>\n  <h1>rankscope {html.escape(__version__)}</h1>\n</body></html>\n"
    )
