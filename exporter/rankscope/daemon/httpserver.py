"""The daemon's HTTP layer on the standard library: a request, a response, a router and a
threaded server with TLS, the way prometheus_client's start_http_server serves /metrics.

An ASGI stack (FastAPI, starlette, pydantic, uvicorn, anyio) cost the daemon about 22 MiB
of resident memory for a dozen GET routes; docs/architecture.md says what was given up.
Every connection is served in its own thread (at most MAX_CONNECTIONS at once), so a slow
collector or a bcrypt check never holds up another request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

log = logging.getLogger("rankscope.daemon")

MAX_CONNECTIONS = 64  # connections served at once; the next waits in the listen backlog
ACCEPT_WAIT_S = 5.0  # how long a connection waits for a free slot before it is dropped
IO_TIMEOUT_S = 30.0  # a client silent this long (idle keep-alive included) is disconnected
STOP_GRACE_S = 5.0  # how long a stop waits for the requests in flight


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # percent-decoded, without the query
    query: str  # raw, as the client sent it
    headers: dict[str, str]  # names lower-cased

    def args(self) -> dict[str, str]:
        """The query's parameters; a repeated one keeps its last value."""
        return dict(parse_qsl(self.query, keep_blank_values=True))

    def url_with(self, **params: int | str) -> str:
        """This request's path and query with ``params`` set (the others kept, in order)."""
        kept = [(k, v) for k, v in parse_qsl(self.query, keep_blank_values=True) if k not in params]
        query = urlencode([*kept, *((k, str(v)) for k, v in params.items())])
        return f"{self.path}?{query}"


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def text(body: str, status: int = 200, content_type: str = "text/plain") -> Response:
    return Response(status, body.encode(), f"{content_type}; charset=utf-8")


def json_response(doc: Any, status: int = 200) -> Response:
    body = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(status, body.encode(), "application/json")


class HTTPError(Exception):
    """An answer other than 200, as JSON ``{"detail": ...}``."""

    def __init__(self, status: int, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}

    def response(self) -> Response:
        response = json_response({"detail": self.detail}, self.status)
        response.headers.update(self.headers)
        return response


def query_int(request: Request, name: str, default: int, *, ge: int, le: int | None = None) -> int:
    """An integer query parameter within [ge, le]; 422 naming it otherwise."""
    raw = request.args().get(name)
    if raw is None:
        return default
    where = {"loc": ["query", name], "input": raw}
    try:
        value = int(raw)
    except ValueError:
        raise HTTPError(422, [{"type": "int_parsing", "msg": "not an integer", **where}]) from None
    if value < ge:
        raise HTTPError(422, [{"type": "greater_than_equal", "msg": f"must be >= {ge}", **where}])
    if le is not None and value > le:
        raise HTTPError(422, [{"type": "less_than_equal", "msg": f"must be <= {le}", **where}])
    return value


Handler = Callable[[Request], Response]
App = Callable[[Request], Response]


class Router:
    """GET (and HEAD) routes by exact path, and path prefixes (static files)."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.prefixes: list[tuple[str, Handler]] = []

    def get(self, path: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes[path] = handler
            return handler

        return register

    def mount(self, prefix: str, handler: Handler) -> None:
        self.prefixes.append((prefix.rstrip("/") + "/", handler))

    def __call__(self, request: Request) -> Response:
        handler = self.routes.get(request.path)
        if handler is None:
            handler = next((h for p, h in self.prefixes if request.path.startswith(p)), None)
        try:
            if handler is None:
                raise HTTPError(404, "Not Found")
            if request.method not in ("GET", "HEAD"):
                raise HTTPError(405, "Method Not Allowed", {"Allow": "GET, HEAD"})
            return handler(request)
        except HTTPError as exc:
            return exc.response()


# The static directory's files, by suffix; anything else is served as bytes.
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}


def static_files(directory: Path, prefix: str) -> Handler:
    """Files under ``directory`` at ``prefix``/NAME; 404 for anything outside it."""
    root = directory.resolve()

    def serve(request: Request) -> Response:
        target = (root / request.path[len(prefix) :].lstrip("/")).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            raise HTTPError(404, "Not Found")
        kind = STATIC_TYPES.get(target.suffix.lower(), "application/octet-stream")
        return Response(200, target.read_bytes(), kind)

    return serve


class RequestHandler(BaseHTTPRequestHandler):
    """One connection: HTTP/1.1 with keep-alive, every method handed to the server's app."""

    server: Server
    protocol_version = "HTTP/1.1"
    timeout = IO_TIMEOUT_S
    # Buffered, so the head and a small body leave in one write (flushed after each request);
    # without it a kept-alive client's delayed ACK held every answer 40 ms.
    wbufsize = -1
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        split = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=unquote(split.path),
            query=split.query,
            headers={k.lower(): v for k, v in self.headers.items()},
        )
        # A body is never read: close after answering, so it is not taken for a request.
        if self.command not in ("GET", "HEAD") or request.headers.get("content-length", "0") != "0":
            self.close_connection = True
        if self.server.stopping:
            self.close_connection = True
        try:
            response = self.server.app(request)
        except HTTPError as exc:
            response = exc.response()
        except Exception:
            log.exception("%s %s failed", self.command, request.path)
            response = text("Internal Server Error\n", 500)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def send_response(self, code: int, message: str | None = None) -> None:
        # No Server header: the version is nobody's business (uvicorn's server_header=False).
        self.log_request(code)
        self.send_response_only(code, message)
        self.send_header("Date", self.date_time_string())

    def send_header(self, keyword: str, value: str) -> None:
        # Lower-case names, as uvicorn sent them (and HTTP/2 requires): clients that read
        # headers into a plain dict keep working.
        super().send_header(keyword.lower(), value)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s %s", self.address_string(), format % args)


class Server(socketserver.TCPServer):
    """A thread per connection, at most MAX_CONNECTIONS of them, on a socket bound by the
    caller; TLS handshakes happen in the connection's thread, never in the accept loop."""

    request_queue_size = 128

    def __init__(
        self,
        sock: socket.socket,
        app: App,
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(sock.getsockname(), RequestHandler, bind_and_activate=False)
        self.socket.close()  # the one TCPServer made; the caller's is already bound
        self.socket = sock
        self.server_address = sock.getsockname()
        self.app = app
        self.tls = tls
        self.stopping = False
        self._max = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._accepting: threading.Thread | None = None
        self.server_activate()

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls is not None else 'http'}://{host}:{port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(timeout=ACCEPT_WAIT_S):
            log.warning("%d connections open: dropped one from %s", self._max, client_address[0])
            self.shutdown_request(request)
            return
        threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name="rankscope-http",
            daemon=True,
        ).start()

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        conn = request
        try:
            if self.tls is not None:
                request.settimeout(IO_TIMEOUT_S)  # a stalled handshake ends too
                conn = self.tls.wrap_socket(request, server_side=True)
            with self._lock:
                self._open.add(conn)
                if self.stopping:  # came in as the stop looked: answer nothing more
                    _end_reads(conn)
            self.finish_request(conn, client_address)
        except OSError as exc:  # a refused handshake, a reset, a client that went away
            log.debug("http %s: %s", client_address[0], exc)
        except Exception:
            log.exception("http %s: the connection failed", client_address[0])
        finally:
            with self._lock:
                self._open.discard(conn)
            self.shutdown_request(conn)
            self._slots.release()

    def start(self) -> None:
        self._accepting = threading.Thread(
            target=self.serve_forever, name="rankscope-http-accept", daemon=True
        )
        self._accepting.start()

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop accepting, let the requests in flight finish (up to ``grace`` seconds),
        close idle keep-alive connections, and close the socket."""
        if self._accepting is not None:
            self.shutdown()  # returns once serve_forever has
        with self._lock:
            self.stopping = True
            for conn in self._open:
                _end_reads(conn)
        deadline = time.monotonic() + grace
        taken = 0
        while taken < self._max and self._slots.acquire(
            timeout=max(0.0, deadline - time.monotonic())
        ):
            taken += 1
        if taken < self._max:
            log.warning("http: %d connection(s) still open at stop", self._max - taken)
        self.server_close()


def _end_reads(conn: socket.socket) -> None:
    """Shut the read side of a connection (of the plain socket, under any TLS): an idle
    keep-alive connection sees its end, an answer being written still goes out."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(conn, socket.SHUT_RD)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (IPv4 or IPv6), not listening yet; OSError naming
    the address when it is taken."""
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
def serving(
    app: App,
    sock: socket.socket | None = None,
    tls: ssl.SSLContext | None = None,
    max_connections: int = MAX_CONNECTIONS,
) -> Iterator[Server]:
    """``app`` served on ``sock`` (default: a free loopback port) until the block ends."""
    server = Server(sock if sock is not None else listen("127.0.0.1", 0), app, tls, max_connections)
    server.start()
    try:
        yield server
    finally:
        server.stop()
