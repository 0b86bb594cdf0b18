"""The daemon's HTTP layer (rankscope.daemon.httpserver) over real loopback sockets: methods,
errors, static files, keep-alive, the bound on connections, a stop that lets answers finish,
the exit on SIGTERM/SIGINT, and an import graph free of the ASGI stack it replaced."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
from tests.daemon.test_daemon_flightstate import mark, rank_recorder

from rankscope.daemon import httpserver
from rankscope.daemon.app import create_app
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.httpserver import Request, Response, Router, Server, listen, serving, text
from rankscope.daemon.registry import TimedCollectors
from rankscope.daemon.webconfig import BasicAuth, WebConfigMiddleware
from rankscope.reports.census import census_document
from rankscope.reports.ledger import phases_document

ServeApp = Callable[[Any], httpx.Client]  # the conftest fixture serve_app


def daemon_app(flight_dir: Path, static_dir: Path | None = None) -> Router:
    state = FlightState(flight_dir)
    extra = {"static_dir": static_dir} if static_dir is not None else {}
    return create_app(
        registry=TimedCollectors().registry(),
        state=state,
        phases_report=lambda flight: phases_document(flight, state.host_pid),
        census_report=census_document,
        **extra,
    )


def raw_get(url: str, path: str) -> tuple[int, bytes]:
    """GET ``path`` sent as is (no client-side normalisation of '..')."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_methods_errors_and_the_json_error_shape(flight_dir: Path, serve_app: ServeApp) -> None:
    client = serve_app(daemon_app(flight_dir))
    get = client.get("/healthz")
    head = client.head("/healthz")
    assert (get.status_code, get.text) == (200, "ok\n")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == get.headers["content-length"] == "3"
    assert "server" not in get.headers  # no version advertised
    post = client.post("/healthz", content=b"x")
    assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
    assert post.json() == {"detail": "Method Not Allowed"}
    assert client.get("/nope").json() == {"detail": "Not Found"}
    assert client.get("/nope").status_code == 404
    bad = client.get("/api/v1/census?limit=abc")
    assert bad.status_code == 422
    (error,) = bad.json()["detail"]
    assert error["loc"] == ["query", "limit"] and error["input"] == "abc"
    (error,) = client.get("/api/v1/phases?offset=-1").json()["detail"]
    assert error["loc"] == ["query", "offset"] and error["type"] == "greater_than_equal"
    assert client.get("/api/v1/phases?boot=nope").status_code == 404
    assert "nope" in client.get("/api/v1/phases?boot=nope").json()["detail"]


def test_next_links_keep_the_other_parameters(flight_dir: Path, serve_app: ServeApp) -> None:
    for rank in range(3):
        rank_recorder(flight_dir, "boot-1", rank, host="elsewhere").write_record(
            mark("pre_weight_load")
        )
    client = serve_app(daemon_app(flight_dir))
    page = client.get("/api/v1/phases?boot=boot-1&limit=1&offset=1").json()["page"]
    assert page["next"] == "/api/v1/phases?boot=boot-1&offset=2&limit=1"
    last = client.get(page["next"]).json()["page"]
    assert last["truncated"] is False and last["next"] is None


def test_static_files_stay_inside_their_directory(
    flight_dir: Path, tmp_path: Path, serve_app: ServeApp
) -> None:
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<html><body></body></html>")
    (static / "app.js").write_text("// js")
    (tmp_path / "secret.txt").write_text("secret")
    client = serve_app(daemon_app(flight_dir, static))
    js = client.get("/static/app.js")
    assert js.text == "// js" and js.headers["content-type"].startswith("text/javascript")
    url = str(client.base_url).rstrip("/")
    for path in ("/static/../secret.txt", "/static/%2e%2e/secret.txt", "/static/", "/static"):
        status, body = raw_get(url, path)
        assert status == 404 and b"secret" not in body, path


def test_a_failing_handler_is_a_500_and_the_server_keeps_serving(
    serve_app: ServeApp, caplog: pytest.LogCaptureFixture
) -> None:
    app = Router()

    @app.get("/boom")
    def boom(request: Request) -> Response:
        raise RuntimeError("kaput")

    app.get("/fine")(lambda request: text("fine"))
    client = serve_app(app)
    with caplog.at_level(logging.ERROR, logger="rankscope.daemon"):
        assert client.get("/boom").status_code == 500
    assert "kaput" in caplog.text
    assert client.get("/fine").text == "fine"


def test_basic_auth_and_headers_wrap_every_answer(flight_dir: Path, serve_app: ServeApp) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    app = WebConfigMiddleware(
        daemon_app(flight_dir), BasicAuth({"alice": hashed}), {"X-Frame-Options": "deny"}
    )
    client = serve_app(app)
    refused = client.get("/healthz")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    assert refused.headers["x-frame-options"] == "deny"
    good = {"Authorization": "Basic " + base64.b64encode(b"alice:pw").decode()}
    assert client.get("/healthz", headers=good).status_code == 200
    missing = client.get("/nope", headers=good)
    assert missing.status_code == 404 and missing.headers["x-frame-options"] == "deny"


def test_keep_alive_and_a_stop_that_lets_an_answer_finish() -> None:
    entered, release = threading.Event(), threading.Event()
    app = Router()

    @app.get("/slow")
    def slow(request: Request) -> Response:
        entered.set()
        release.wait(30)
        return text("done")

    app.get("/fast")(lambda request: text("fast"))
    server = Server(listen("127.0.0.1", 0), app)
    server.start()
    host, port = server.socket.getsockname()[:2]
    idle = http.client.HTTPConnection(host, port, timeout=10)
    for _ in range(2):  # two requests, one connection
        idle.request("GET", "/fast")
        assert idle.getresponse().read() == b"fast"
    idle_sock = idle.sock
    answers: list[bytes] = []

    def fetch() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/slow")
        answers.append(conn.getresponse().read())

    fetcher = threading.Thread(target=fetch)
    fetcher.start()
    assert entered.wait(10)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 30})
    stopper.start()
    # The idle kept-alive connection is closed by the stop; the slow answer is awaited.
    assert idle_sock.recv(1) == b""
    assert stopper.is_alive() and answers == []
    release.set()
    stopper.join(30)
    fetcher.join(30)
    assert answers == [b"done"] and not stopper.is_alive()
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2)


def test_connections_are_bounded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(httpserver, "ACCEPT_WAIT_S", 0.2)
    app = Router()
    app.get("/fast")(lambda request: text("fast"))
    with serving(app, max_connections=2) as server:
        host, port = server.socket.getsockname()[:2]
        held = [socket.create_connection((host, port), timeout=10) for _ in range(2)]
        with caplog.at_level(logging.WARNING, logger="rankscope.daemon"):
            third = socket.create_connection((host, port), timeout=10)
            third.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
            assert third.recv(100) == b""  # dropped, not answered
        assert "2 connections open: dropped one" in caplog.text
        workers = [t for t in threading.enumerate() if t.name == "rankscope-http"]
        assert len(workers) == 2
        held[0].close()
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/fast")
        assert conn.getresponse().read() == b"fast"
        conn.close()
        third.close()
        held[1].close()


def exchange(host: str, port: int, data: bytes) -> bytes:
    """``data`` sent as is on a new connection; everything the server writes before it
    closes (a connection kept open for another request reads as a timeout)."""
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(data)
        conn.settimeout(2)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            chunks.append(b"<open>")
        return b"".join(chunks)


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"GET /x HTTP/1.1\r\n" + b"h: v\r\n" * 101 + b"\r\n", b"431"),
        (b"GET /x HTTP/1.1\r\nh: " + b"v" * 70000 + b"\r\n\r\n", b"431"),
        (b"GET /" + b"x" * 70000 + b" HTTP/1.1\r\n\r\n", b"414"),
        (b"GET /x\r\n\r\n", b"400"),
        (b"GET /x HTTP/1.1 extra\r\n\r\n", b"400"),
        (b"GET /x HTTP/x\r\n\r\n", b"400"),
        (b"GET /x HTTP/2.0\r\n\r\n", b"505"),
        (b"GET /x HTTP/1.1\r\nno colon\r\n\r\n", b"400"),
        (b"GET /x HTTP/1.1\r\nname : v\r\n\r\n", b"400"),
    ],
)
def test_a_request_that_cannot_be_read_is_refused_and_closed(sent: bytes, status: bytes) -> None:
    app = Router()
    app.get("/x")(lambda request: text("x"))
    with serving(app) as server:
        host, port = server.socket.getsockname()[:2]
        answer = exchange(host, port, sent)
        assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:100]
        assert b"connection: close" in answer and not answer.endswith(b"<open>")
        assert exchange(host, port, b"GET /x HTTP/1.0\r\n\r\n").endswith(b"\r\n\r\nx")


def test_requests_are_read_as_http_1_0_and_1_1_clients_send_them() -> None:
    seen: list[Request] = []
    app = Router()

    @app.get("/x")
    def x(request: Request) -> Response:
        seen.append(request)
        return text("x")

    with serving(app) as server:
        host, port = server.socket.getsockname()[:2]
        # HTTP/1.0 closes unless asked to keep the connection; HTTP/1.1 keeps it unless told.
        assert not exchange(host, port, b"GET /x HTTP/1.0\r\n\r\n").endswith(b"<open>")
        kept = exchange(host, port, b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert kept.endswith(b"x<open>") and b"connection: close" not in kept
        assert exchange(host, port, b"GET /x HTTP/1.1\r\n\r\n").endswith(b"x<open>")
        closed = exchange(host, port, b"GET /x HTTP/1.1\r\nConnection: Close\r\n\r\n")
        assert closed.endswith(b"x") and b"connection: close" in closed
        # Two requests in one write are two answers; a HEAD has the GET's length, no body.
        both = exchange(host, port, b"HEAD /x HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\n\r\n")
        assert both.count(b"HTTP/1.1 200 OK\r\n") == 2 and both.count(b"content-length: 1\r\n") == 2
        assert both.endswith(b"\r\n\r\nx<open>")
        # A folded header continues the one before; names are case-insensitive, the last of
        # a repeated one is kept; a request with a body is answered, then the connection ends.
        exchange(
            host, port, b"GET //x?a=1 HTTP/1.1\r\nX-One: a\r\n b\r\nX-TWO: 1\r\nx-two: 2\r\n\r\n"
        )
        posted = exchange(host, port, b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nab")
        assert posted.startswith(b"HTTP/1.1 405 ") and not posted.endswith(b"<open>")
    request = seen[-1]
    assert (request.path, request.query) == ("/x", "a=1")
    assert request.headers["x-one"] == "a b" and request.headers["x-two"] == "2"


def test_the_date_header_is_an_http_date_in_english() -> None:
    assert httpserver.http_date(0) == "Thu, 01 Jan 1970 00:00:00 GMT"
    assert httpserver.http_date(1_780_000_000) == "Thu, 28 May 2026 20:26:40 GMT"


def _started(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    for line in proc.stderr:
        if "serving on" in line:
            return line
    raise AssertionError(f"rankscope serve exited {proc.wait()} without serving")


@pytest.mark.parametrize(
    ("sig", "status"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)]
)
def test_serve_ends_by_the_signal_it_was_sent(
    flight_dir: Path, sig: signal.Signals, status: int
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "serve", f"--flight-dir={flight_dir}",
         "--web.listen-address=127.0.0.1:0", "--no-collector.cards",
         "--no-collector.holdings", "--log.level=debug"],
        stderr=subprocess.PIPE, text=True,
        # As a terminal starts it: a runner may start children with SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        url = _started(proc).split("serving on ")[1].split("/metrics")[0]
        assert json.loads(httpx.get(url + "/readyz").text)["ready"] is True
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == status
        rest = proc.stderr.read() if proc.stderr else ""
        assert "Traceback" not in rest and "still open at stop" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


BUILD_AND_LIST_MODULES = """
import argparse, json, sys
from rankscope.daemon import cli
parser = argparse.ArgumentParser()
cli.configure_parser(parser, "serve")
cli.build(parser.parse_args(sys.argv[1:]))
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} | set(sys.modules))))
"""
ASGI_STACK = {"fastapi", "starlette", "pydantic", "pydantic_core", "uvicorn", "anyio", "h11"}
# Loaded only by the run that needs them: OTLP, a web config, basic auth.
ON_DEMAND = {"opentelemetry", "yaml", "bcrypt", "google"}


def test_a_plain_serve_loads_no_asgi_stack_nor_on_demand_packages(
    flight_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "cards.json"
    script.write_text(json.dumps({"cards": [{"total": "8GiB", "free": "4GiB"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RANKSCOPE_"))}
    out = subprocess.run(
        [sys.executable, "-c", BUILD_AND_LIST_MODULES, f"--flight-dir={flight_dir}",
         "--device.source=script", f"--device.script={script}"],
        capture_output=True, text=True, timeout=120, check=True, env=env,
    )  # fmt: skip
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert "rankscope" in loaded and "prometheus_client" in loaded  # the check sees imports
    assert loaded.isdisjoint(ASGI_STACK), sorted(loaded & ASGI_STACK)
    assert loaded.isdisjoint(ON_DEMAND), sorted(loaded & ON_DEMAND)
