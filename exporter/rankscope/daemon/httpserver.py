"""The daemon's HTTP layer on the standard library: a request, a response, a router and a
server with TLS and a thread per connection, so a slow collector holds up no other request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

if TYPE_CHECKING:  # ssl loads only when the web config asks for TLS (rankscope.daemon.webconfig)
    import ssl

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


# http.server's limits on a request line or header line, and on the headers.
MAX_LINE = 65536
MAX_HEADERS = 100
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class RequestHandler(socketserver.StreamRequestHandler):
    """One connection: HTTP/1.1 with keep-alive, within http.server's limits. Not on
    http.server, whose http.client import brings email and ssl into a daemon without TLS
    (docs/architecture.md, "What the daemon imports")."""

    server: Server
    timeout = IO_TIMEOUT_S
    # One write per answer: otherwise a kept-alive client's delayed ACK holds each for 40 ms.
    wbufsize = -1
    disable_nagle_algorithm = True

    def handle(self) -> None:
        try:
            while self.handle_one_request():
                pass
        except TimeoutError:  # a client silent for IO_TIMEOUT_S, idle keep-alive included
            log.debug("http %s: timed out", self.client_address[0])

    def handle_one_request(self) -> bool:
        """Read and answer one request; whether the connection stays open for another."""
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            return False
        try:
            if len(line) > MAX_LINE:
                raise HTTPError(414, "request line too long")
            method, target, version = _request_line(line)
            headers = self._headers()
        except HTTPError as exc:  # a request that cannot be read: answered, then closed
            self._answer(text(f"{exc.detail}\n", exc.status), repr(line[:80]), close=True)
            return False
        connection = headers.get("connection", "").lower()
        keep_alive = connection == "keep-alive" or (version == "HTTP/1.1" and connection != "close")
        # A body is never read: close after answering, so it is not taken for a request.
        body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        if method not in ("GET", "HEAD") or body or self.server.stopping:
            keep_alive = False
        split = urlsplit(target)
        request = Request(
            method=method, path=unquote(split.path), query=split.query, headers=headers
        )
        try:
            response = self.server.app(request)
        except HTTPError as exc:
            response = exc.response()
        except Exception:
            log.exception("%s %s failed", method, request.path)
            response = text("Internal Server Error\n", 500)
        self._answer(response, f"{method} {target}", close=not keep_alive, head=method == "HEAD")
        return keep_alive

    def _headers(self) -> dict[str, str]:
        """The headers, names lower-cased (a repeated one keeps its last value)."""
        headers: dict[str, str] = {}
        name = ""
        for _ in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_LINE + 1)
            if len(line) > MAX_LINE:
                raise HTTPError(431, "header line too long")
            if line in (b"\r\n", b"\n", b""):
                return headers
            decoded = line.decode("iso-8859-1").rstrip("\r\n")
            if decoded[:1] in (" ", "\t") and name:
                headers[name] += " " + decoded.strip()
                continue
            key, sep, value = decoded.partition(":")
            if not sep or not key or key != key.strip():
                raise HTTPError(400, f"bad header line {decoded[:80]!r}")
            name = key.lower()
            headers[name] = value.strip()
        raise HTTPError(431, f"more than {MAX_HEADERS} headers")

    def _answer(self, response: Response, what: str, close: bool, head: bool = False) -> None:
        status = response.status
        log.debug("http %s %s %d", self.client_address[0], what, status)
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:  # a status Python does not name
            reason = ""
        # No Server header; lower-case names, as the daemon has always sent them.
        head_lines = [
            f"HTTP/1.1 {status} {reason}",
            f"date: {http_date(time.time())}",
            f"content-type: {response.content_type}",
            f"content-length: {len(response.body)}",
            *(f"{name.lower()}: {value}" for name, value in response.headers.items()),
        ]
        if close:
            head_lines.append("connection: close")
        self.wfile.write(("\r\n".join(head_lines) + "\r\n\r\n").encode("iso-8859-1"))
        if not head:
            self.wfile.write(response.body)
        self.wfile.flush()


def _request_line(raw: bytes) -> tuple[str, str, str]:
    """(method, target, version) of an HTTP/1.x request line; HTTPError otherwise."""
    words = raw.decode("iso-8859-1").rstrip("\r\n").split()
    if len(words) != 3:
        raise HTTPError(400, f"bad request line {raw[:80]!r}")
    method, target, version = words
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        if version.startswith("HTTP/") and version[5:6].isdigit() and version[5:6] >= "2":
            raise HTTPError(505, f"HTTP version {version[5:]!r} not supported")
        raise HTTPError(400, f"bad request version {version[:20]!r}")
    if target.startswith("//"):
        target = "/" + target.lstrip("/")  # as http.server: never a scheme-relative URL
    return method, target, version


def http_date(when: float) -> str:
    """An HTTP date (RFC 9110 IMF-fixdate), in English whatever the locale."""
    t = time.gmtime(when)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


class Server(socketserver.TCPServer):
    """A thread per connection, at most MAX_CONNECTIONS, on a socket the caller bound; TLS
    handshakes happen in the connection's thread, never in the accept loop."""

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
        """Stop accepting, close idle connections, give the rest ``grace`` seconds, close."""
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
    """Shut the read side: an idle connection sees its end, an answer still goes out."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(conn, socket.SHUT_RD)


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
