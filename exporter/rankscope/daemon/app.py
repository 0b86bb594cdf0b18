"""The daemon's HTTP side: /metrics, /healthz, /readyz, the JSON API, the status page."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.registry import CollectorRegistry

from rankscope import __version__
from rankscope.daemon.exposition import choose_encoder
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.httpserver import (
    Handler,
    HTTPError,
    Request,
    Response,
    Router,
    json_response,
    query_int,
    static_files,
    text,
)
from rankscope.daemon.oom import OomBook
from rankscope.daemon.paging import DEFAULT_LIMIT, MAX_LIMIT, paginate
from rankscope.daemon.sampler import CardView, Sampler
from rankscope.daemon.sources import FLIGHT_REFRESH_S
from rankscope.record.reader import BootNotFoundError, Flight

# Prometheus's default scrape timeout: a collection running longer is stuck, not slow.
STUCK_SCRAPE_SECONDS = 10.0
# The API refreshes the flight state itself only when older (no refresher running).
API_REFRESH_S = 2 * FLIGHT_REFRESH_S

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


# A report function turns the records of one boot into what the CLI's --json prints.
Report = Callable[[Flight], dict[str, Any]]


def create_app(
    *,
    registry: CollectorRegistry,
    state: FlightState,
    phases_report: Report,
    census_report: Report,
    cards: Sampler | None = None,
    ooms: OomBook | None = None,
    static_dir: Path = STATIC_DIR,
    collecting: Callable[[], float | None] | None = None,
) -> Router:
    app = Router()
    app.get("/metrics")(_metrics(registry))
    app.get("/healthz")(lambda request: text("ok\n"))
    app.get("/readyz")(_readiness(state, cards, collecting))
    app.get("/api/v1/boots")(lambda request: _boots(state))
    app.get("/api/v1/phases")(
        _paged(lambda request: phases_report(_flight(state, request)), PHASES_LISTS)
    )
    app.get("/api/v1/census")(
        _paged(lambda request: census_report(_flight(state, request)), CENSUS_LISTS)
    )
    app.get("/api/v1/cards")(lambda request: json_response(cards_document(cards, ooms)))
    app.get("/api/v1/oom")(_paged(lambda request: _oom_document(ooms), ("ooms",)))
    if static_dir.is_dir():
        app.mount("/static", static_files(static_dir, "/static"))
    app.get("/")(_landing(static_dir / "index.html"))
    return app


def _metrics(registry: CollectorRegistry) -> Handler:
    def metrics(request: Request) -> Response:
        # Each request has its own thread, so a slow collector holds up no other request.
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(registry)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return Response(200, body, content_type, headers)

    return metrics


def _readiness(
    state: FlightState, cards: Sampler | None, collecting: Callable[[], float | None] | None
) -> Handler:
    def readyz(request: Request) -> Response:
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
        return json_response(body, status=200 if not problems else 503)

    return readyz


def _boots(state: FlightState) -> Response:
    _fresh(state)
    return json_response({"boots": [b.as_json() for b in state.boots()]})


def _paged(document: Callable[[Request], dict[str, Any]], lists: tuple[str, ...]) -> Handler:
    """A route answering ``document`` with its ``lists`` paged by ?offset= and ?limit=."""

    def answer(request: Request) -> Response:
        # A bad page is a 422 naming it, before anything is read.
        offset = query_int(request, "offset", 0, ge=0)
        limit = query_int(request, "limit", DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
        doc = document(request)

        def next_url(at: int) -> str:
            return request.url_with(offset=at, limit=limit)

        return json_response(paginate(doc, lists, offset, limit, next_url))

    return answer


def cards_document(cards: Sampler | None, ooms: OomBook | None = None) -> dict[str, Any]:
    """GET /api/v1/cards (docs/architecture.md): every process listed (the metric is capped,
    this is not), and each card's latest OOM."""
    if cards is None:
        return {"cards": [], "why": "the card monitor is not running"}
    failing = cards.source_failing
    why = f"device source {cards.source.name} is down: {failing}" if failing else None
    if why is None and not cards.tried.is_set():
        why = "the device source has not been tried yet"
    latest = ooms.latest_by_uuid() if ooms is not None else {}
    body = [{**_card(v), "last_oom": latest.get(v.identity.uuid)} for v in cards.views()]
    return {"cards": body, "why": why}


def _card(v: CardView) -> dict[str, Any]:
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
        "rank_resident": held.rank_resident if held else None,
        "foreign": held.foreign if held else None,
        "unattributed": held.unattributed if held else None,
        "processes": [h.as_json() for h in (held.processes if held else ())],
    }


def _oom_document(ooms: OomBook | None) -> dict[str, Any]:
    if ooms is None:
        return {"ooms": [], "why": "the oom collector is off"}
    return {"ooms": ooms.documents()}


def _landing(index: Path) -> Handler:
    def landing(request: Request) -> Response:
        if index.is_file():
            return text(with_links(index.read_text(encoding="utf-8")), content_type="text/html")
        return text(landing_page(), content_type="text/html")

    return landing


# The long lists of each answer, paged by ?offset= and ?limit= (docs/architecture.md, API).
PHASES_LISTS = ("processes",)
CENSUS_LISTS = ("ranks", "entries", "history", "in_process")


def _fresh(state: FlightState) -> None:
    """The state as of at most API_REFRESH_S ago; 503 when the directory cannot be read (a
    directory no job has written yet is empty, not an error)."""
    state.refresh_if_older(API_REFRESH_S)
    if state.up is False:
        raise HTTPError(503, f"flight directory {state.flight_dir}: {state.error}")


def _flight(state: FlightState, request: Request) -> Flight:
    """The boot ?boot= names (the latest by default); 404 for one the state lacks."""
    _fresh(state)
    try:
        return state.flight(request.args().get("boot"))
    except BootNotFoundError as exc:
        raise HTTPError(404, str(exc)) from exc


_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"}


def escape(text: str) -> str:
    """html.escape (quotes included) without the html module, whose entity table cost the
    daemon 0.3 MiB of resident memory."""
    for char, entity in _ENTITIES.items():
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
