"""The daemon's HTTP side (FastAPI on uvicorn, rankscope.daemon.server and .guard) over real
loopback sockets: methods, errors, static files, keep-alive, the refusal of heads that cannot
be read safely, control characters, clipped echoes, the head deadline, a stop that lets
answers finish, the exit on SIGTERM/SIGINT, and what a plain serve imports."""

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
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from tests.daemon.test_daemon_flightstate import mark, rank_recorder

from rankscope.daemon import guard
from rankscope.daemon.app import create_app
from rankscope.daemon.flightstate import FlightState
from rankscope.daemon.registry import TimedCollectors
from rankscope.daemon.server import serving
from rankscope.daemon.webauth import WebAuth

ServeApp = Callable[[Any], httpx.Client]  # the conftest fixture serve_app


def daemon_app(flight_dir: Path, static_dir: Path | None = None) -> Any:
    state = FlightState(flight_dir)
    extra = {"static_dir": static_dir} if static_dir is not None else {}
    return create_app(
        registry=TimedCollectors().registry(),
        state=state,
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
    assert post.status_code == 405
    assert sorted(post.headers["allow"].split(", ")) == ["GET", "HEAD"]
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
    app = FastAPI()

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("kaput")

    app.get("/fine")(lambda: PlainTextResponse("fine"))
    client = serve_app(app)
    with caplog.at_level(logging.ERROR, logger="rankscope.daemon"):
        assert client.get("/boom").status_code == 500
        # Logged once the 500 is sent, on the server's thread.
        for _ in range(100):
            if "GET /boom failed" in caplog.text:
                break
            threading.Event().wait(0.05)
    assert "kaput" in caplog.text and "GET /boom failed" in caplog.text
    assert client.get("/fine").text == "fine"


def test_basic_auth_and_headers_wrap_every_answer(
    flight_dir: Path, tmp_path: Path, serve_app: ServeApp
) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        f"basic_auth_users:\n  alice: '{hashed}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    app = WebAuth(daemon_app(flight_dir), cfg)
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
    app = FastAPI()

    @app.get("/slow")
    def slow() -> Any:
        entered.set()
        release.wait(30)
        return PlainTextResponse("done")

    app.get("/fast")(lambda: PlainTextResponse("fast"))
    with serving(app) as server:
        host, port = server.address
        idle = http.client.HTTPConnection(host, port, timeout=10)
        for _ in range(2):  # two requests, one connection
            idle.request("GET", "/fast")
            assert idle.getresponse().read() == b"fast"
        assert idle.sock is not None
        idle_sock = idle.sock
        answers: list[bytes] = []

        def fetch() -> None:
            conn = http.client.HTTPConnection(host, port, timeout=30)
            conn.request("GET", "/slow")
            answers.append(conn.getresponse().read())

        fetcher = threading.Thread(target=fetch)
        fetcher.start()
        assert entered.wait(10)
        server.should_exit = True
        # The idle kept-alive connection is closed by the stop; the slow answer is awaited.
        assert idle_sock.recv(1) == b""
        assert answers == []
        release.set()
        fetcher.join(30)
        assert answers == [b"done"]
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2)


def exchange(host: str, port: int, data: bytes) -> bytes:
    """``data`` sent as is on a new connection; everything the server writes before it
    closes (a connection kept open for another request reads as a timeout)."""
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(data)
        conn.settimeout(1)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            chunks.append(b"<open>")
        return b"".join(chunks)


GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(
    "sent",
    [
        GET + b"h: v\r\n" * 101 + b"\r\n",  # more than 100 header fields
        GET + b"h: " + b"v" * 20000 + b"\r\n\r\n",  # a head over 16 KiB
        b"GET /" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n",
        b"GET /healthz\r\n\r\n",
        b"GET /healthz HTTP/1.1 extra\r\n\r\n",
        b"GET /healthz HTTP/x\r\n\r\n",
        GET + b"no colon\r\n\r\n",
        GET + b"name : v\r\n\r\n",
        b"GET /\xff HTTP/1.1\r\n\r\n",  # a target that is not ASCII
        b"GET /a\x00b HTTP/1.1\r\n\r\n",
        # Request smuggling: conflicting, duplicate, or ambiguous lengths.
        GET + b"Content-Length: 51\r\nContent-Length: 0\r\n\r\n",
        GET + b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n",
        GET + b"Content-Length: 0, 0\r\n\r\n",
        GET + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
)
def test_a_request_that_cannot_be_read_safely_is_refused_and_closed(sent: bytes) -> None:
    app = FastAPI()
    app.get("/healthz")(lambda: PlainTextResponse("ok"))
    with serving(app) as server:
        host, port = server.address
        answer = exchange(host, port, sent)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]
        assert answer.endswith(b"Invalid HTTP request received.")  # closed, nothing echoed
        assert exchange(host, port, b"GET /healthz HTTP/1.0\r\n\r\n").endswith(b"\r\n\r\nok")


def test_a_control_character_in_a_path_or_query_is_a_400_and_logged_escaped(
    flight_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    static = tmp_path / "static"
    static.mkdir()
    (static / "app.js").write_text("// js")
    with serving(daemon_app(flight_dir, static)) as server:
        host, port = server.address
        with caplog.at_level(logging.DEBUG, logger="rankscope.daemon"):
            for target in (
                b"/static/app.js%00",
                b"/static/%00",
                b"/x%0aFORGED%20line",
                b"/api/v1/phases?boot=%00",
                b"/api/v1/phases?boot=a%0d%0ab",
            ):
                answer = exchange(host, port, b"GET " + target + b" HTTP/1.0\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 400 "), (target, answer[:100])
            # A Unicode line separator and an escape sequence are escaped in the log too.
            exchange(host, port, b"GET /nope%E2%80%A8%1b[31m HTTP/1.0\r\n\r\n")
    lines = [r.getMessage() for r in caplog.records]
    assert any("/x\\nFORGED line" in line for line in lines), lines
    assert all("\n" not in line and "\x1b" not in line for line in lines)


def test_an_error_echoes_at_most_200_bytes(flight_dir: Path, serve_app: ServeApp) -> None:
    client = serve_app(daemon_app(flight_dir))
    huge = "9" * 12_000  # within the 16 KiB head; a 60 KB one is refused before the app
    bad = client.get(f"/api/v1/census?limit={huge}")
    (error,) = bad.json()["detail"]
    assert bad.status_code == 422 and error["loc"] == ["query", "limit"]
    assert error["input"].startswith("999") and len(error["input"].encode()) <= 203
    assert len(bad.content) < 1000
    missing = client.get("/api/v1/phases", params={"boot": "b" * 12_000})
    assert missing.status_code == 404 and len(missing.content) < 1000


def test_requests_are_read_as_http_1_0_and_1_1_clients_send_them() -> None:
    seen: list[Request] = []
    app = FastAPI()

    @app.api_route("/x", methods=["GET", "HEAD"])
    def x(request: Request) -> Any:
        seen.append(request)
        return PlainTextResponse("x")

    with serving(app) as server:
        host, port = server.address
        # HTTP/1.0 closes unless asked to keep the connection; HTTP/1.1 keeps it unless told.
        assert not exchange(host, port, b"GET /x HTTP/1.0\r\n\r\n").endswith(b"<open>")
        assert exchange(host, port, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n").endswith(b"x<open>")
        closed = exchange(host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n")
        assert closed.endswith(b"x") and b"connection: close" in closed.lower()
        # Two requests in one write are two answers; a HEAD has the GET's length, no body.
        both = exchange(
            host,
            port,
            b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n" + GET.replace(b"/healthz", b"/x") + b"\r\n",
        )
        assert both.count(b"HTTP/1.1 200 OK\r\n") == 2 and both.count(b"content-length: 1\r\n") == 2
        assert both.endswith(b"\r\n\r\nx<open>")
        exchange(host, port, b"GET /x?a=1 HTTP/1.0\r\nX-TWO: 1\r\nx-two: 2\r\n\r\n")
    request = seen[-1]
    assert (request.url.path, request.url.query) == ("/x", "a=1")
    assert request.headers.getlist("x-two") == ["1", "2"]


def test_a_head_dripped_past_the_deadline_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "HEAD_DEADLINE_S", 0.5)
    app = FastAPI()
    app.get("/healthz")(lambda: PlainTextResponse("ok"))
    with serving(app) as server:
        host, port = server.address
        with socket.create_connection((host, port), timeout=10) as slow:
            slow.sendall(GET)
            ended = None
            for _ in range(30):  # one header line every 0.1 s: never the blank line
                try:
                    slow.sendall(b"x-drip: 1\r\n")
                except OSError:
                    ended = "reset"
                    break
                slow.settimeout(0.1)
                try:
                    if slow.recv(1) == b"":
                        ended = "closed"
                        break
                except TimeoutError:
                    pass
            assert ended is not None, "a head dripped for 3 s was still read"
        # An idle kept-alive connection waits past the head deadline: its clock starts at
        # the next head's first byte.
        with socket.create_connection((host, port), timeout=10) as kept:
            kept.sendall(GET + b"\r\n")
            assert read_answer(kept).endswith(b"ok")
            threading.Event().wait(1.0)
            kept.sendall(GET + b"\r\n")
            assert read_answer(kept).endswith(b"ok")


def read_answer(conn: socket.socket) -> bytes:
    """One answer with a body of Content-Length bytes, read off a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        ).split(b":")[1]
    )
    while len(body) < length:
        body += conn.recv(4096)
    return head + b"\r\n\r\n" + body


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
# Loaded only by the run that needs them: OTLP's protobuf, a web config, basic auth.
# (FastAPI imports opentelemetry's API where it is installed.)
ON_DEMAND = {"yaml", "bcrypt", "google"}


def test_a_plain_serve_loads_no_on_demand_packages(flight_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "cards.json"
    script.write_text(json.dumps({"cards": [{"total": "8GiB", "free": "4GiB"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RANKSCOPE_"))}
    out = subprocess.run(
        [sys.executable, "-c", BUILD_AND_LIST_MODULES, f"--flight-dir={flight_dir}",
         "--device.source=script", f"--device.script={script}"],
        capture_output=True, text=True, timeout=120, check=True, env=env,
    )  # fmt: skip
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert {"rankscope", "prometheus_client", "fastapi", "uvicorn"} <= loaded  # it sees imports
    assert loaded.isdisjoint(ON_DEMAND), sorted(loaded & ON_DEMAND)
