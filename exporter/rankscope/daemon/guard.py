"""The HTTP server's limits toward the network, on uvicorn's h11 protocol: a deadline for
each request head (slowloris), bounds on a head's size and field count, no duplicate or
ambiguous body length (request smuggling), no control character in a path or query, escaped
log lines, and a cap on open connections that sheds the one waiting longest for a head."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
from h11._readers import maybe_read_from_IDLE_client
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("rankscope.daemon")

HEAD_DEADLINE_S = 10.0  # a request head (line and fields) must arrive whole within this
MAX_HEAD_BYTES = 16 * 1024  # of a request head: h11's default bound on an incomplete event
MAX_HEADERS = 100  # header fields in one head
MAX_CONNECTIONS = 1000  # open at once; past it, the one waiting longest for a head is shed
LOGGED_CHARS = 200  # of a client's path in a log line

_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(.*?)[ \t\r]*$", re.IGNORECASE)


def _strict_head(buf: Any) -> h11.Request | None:
    """h11's reader of a request head, refusing what h11 lets through (a head that arrived
    whole is not bound by h11; two Content-Lengths are refused even of equal values)."""
    pending = bytes(buf)
    request = maybe_read_from_IDLE_client(buf)
    if request is None:
        return None
    head = pending[: len(pending) - len(buf)]
    if len(head) > MAX_HEAD_BYTES:
        raise h11.LocalProtocolError("request head too large", error_status_hint=431)
    fields = [line for line in head.split(b"\n")[1:] if line.strip()]
    if len(fields) > MAX_HEADERS:
        raise h11.LocalProtocolError("too many header fields", error_status_hint=431)
    lengths = [m.group(1) for m in map(_CONTENT_LENGTH.match, fields) if m]
    if len(lengths) > 1 or any(not length.isdigit() for length in lengths):
        raise h11.LocalProtocolError("more than one Content-Length")
    names = {name for name, _ in request.headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        raise h11.LocalProtocolError("both Content-Length and Transfer-Encoding")
    if not request.target.isascii():
        raise h11.LocalProtocolError("request target not ASCII")
    return request


class StrictConnection(h11.Connection):
    """An h11 server connection that reads request heads with _strict_head."""

    def _get_io_object(self, role: Any, event: Any, io_dict: Any) -> Any:
        io = super()._get_io_object(role, event, io_dict)
        return _strict_head if io is maybe_read_from_IDLE_client else io


class StrictH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with StrictConnection, a head deadline (from its first byte; a
    new connection's clock starts at once) and a cap on open connections."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = StrictConnection(h11.SERVER, MAX_HEAD_BYTES)
        self._head_timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0  # when it last began to wait for a request head

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.idle_since = self.loop.time()
        self._start_head_clock()
        if len(self.connections) <= MAX_CONNECTIONS:
            return
        peers = [c for c in self.connections if isinstance(c, StrictH11Protocol) and c is not self]
        waiting = [c for c in peers if c.waiting_for_head()]
        if waiting:
            oldest = min(waiting, key=lambda c: c.idle_since)
            log.warning(
                "http: %d connections open, closed one from %s (idle or waiting for a "
                "request head the longest)",
                len(self.connections),
                oldest.peer,
            )
            oldest.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.waiting_for_head():
            self._start_head_clock()
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_clock()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # The next head's clock starts at its first byte; till then the connection is idle
        # (uvicorn's keep-alive timeout).
        self._stop_head_clock()
        self.idle_since = self.loop.time()
        super().on_response_complete()

    @property
    def peer(self) -> str:
        return self.client[0] if self.client else "?"

    def waiting_for_head(self) -> bool:
        idle = self.cycle is None or self.cycle.response_complete
        return idle and self.conn.their_state is h11.IDLE

    def _start_head_clock(self) -> None:  # only where no clock runs
        self._head_timer = self.loop.call_later(HEAD_DEADLINE_S, self._head_overdue)

    def _stop_head_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.waiting_for_head():
            log.debug("http %s: no whole request head in %.0fs, closed", self.peer, HEAD_DEADLINE_S)
            self.transport.close()


class RequestGuard:
    """The outermost ASGI layer: a 400 for a control character in the (decoded) path or query,
    a 500 logged (path escaped) for a failure no inner layer answered, a debug line per answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only HTTP reaches here: the server runs without lifespan and websockets.
        path = scope["path"]
        # Cut, with control and non-ASCII characters escaped, so no input forges a log line.
        what = f"{scope['method']} {path[:LOGGED_CHARS].encode('unicode_escape').decode()}"
        client = scope["client"][0] if scope.get("client") else "?"
        query = unquote_to_bytes(scope.get("query_string", b""))
        if _CONTROL.search(path.encode("utf-8", "surrogateescape")) or _CONTROL.search(query):
            log.debug("http %s %s: control character, 400", client, what)
            bad = "Bad Request: a control character in the path or query\n"
            await PlainTextResponse(bad, 400)(scope, receive, send)
            return
        status: list[int] = []

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("http %s %s failed", client, what)
            if not status:
                await PlainTextResponse("Internal Server Error\n", 500)(scope, receive, send)
            return
        log.debug("http %s %s %s", client, what, status[0] if status else "-")
