"""A real `rankscope serve` attacked over loopback: slow headers and half-open TLS handshakes
while Prometheus scrapes, unfinished huge request heads against its memory, request
smuggling, control characters, forged log lines and echoed input. Every loop is bounded in
count and time; the deadlines asserted are the ones the daemon promises a scraper."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.daemon.test_daemon_serve import serve
from tests.daemon.test_daemon_webconfig import make_self_signed

from rankscope.daemon.guard import HEAD_DEADLINE_S

SLOW_HEADERS = 500
HALF_OPEN_TLS = 100
SCRAPES = 10
SCRAPE_DEADLINE_S = 1.0
UNFINISHED_HEADS = 64
RSS_BUDGET = 128 * 2**20
QUIET = ("--no-collector.cards", "--no-collector.holdings")


def host_port(url: str) -> tuple[str, int]:
    host, port = url.split("://")[1].rsplit(":", 1)
    return host, int(port)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def serve_pid(port: int) -> int:
    """The pid of the `rankscope serve` listening on ``port`` (a child of this test)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"serve\0" in cmdline and f"127.0.0.1:{port}".encode() in cmdline:
            return int(pid)
    raise AssertionError(f"no rankscope serve on port {port}")


@contextlib.contextmanager
def tls_daemon(flight_dir: Path, tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext]]:
    cert, _ = make_self_signed(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    trust = ssl.create_default_context(cafile=str(cert))
    with serve(flight_dir, f"--web.config.file={cfg}", *QUIET, log=tmp_path / "serve.log") as url:
        yield url, trust


def slow_header_connection(host: str, port: int, trust: ssl.SSLContext) -> socket.socket:
    """A TLS connection that has sent a request line and one header, and stops there."""
    raw = socket.create_connection((host, port), timeout=10)
    conn = trust.wrap_socket(raw, server_hostname=host)
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    return conn


def half_open_tls(host: str, port: int) -> socket.socket:
    """A connection that begins a TLS handshake (a record header of a ClientHello) and never
    finishes it."""
    conn = socket.create_connection((host, port), timeout=10)
    conn.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    return conn


def timed_scrape(host: str, port: int, trust: ssl.SSLContext) -> float:
    """Seconds for one scrape on a new connection (its handshake included)."""
    started = time.monotonic()
    conn = http.client.HTTPSConnection(host, port, timeout=10, context=trust)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200 and b"rankscope_up" in body
    return time.monotonic() - started


def still_open(conn: socket.socket) -> bool:
    """Whether the server has not closed ``conn`` (nothing to read, no end of stream)."""
    conn.setblocking(False)
    try:
        return bool(conn.recv(1))
    except (BlockingIOError, ssl.SSLWantReadError):
        return True
    except OSError:
        return False


def test_slow_headers_and_half_open_handshakes_never_blind_the_scrape(
    flight_dir: Path, tmp_path: Path
) -> None:
    with tls_daemon(flight_dir, tmp_path) as (url, trust), contextlib.ExitStack() as held:
        host, port = host_port(url)
        pid = serve_pid(port)
        baseline_fds = open_fds(pid)
        opened_at = time.monotonic()
        slow = [
            held.enter_context(slow_header_connection(host, port, trust))
            for _ in range(SLOW_HEADERS)
        ]
        half = [held.enter_context(half_open_tls(host, port)) for _ in range(HALF_OPEN_TLS)]
        half_opened_at = time.monotonic()
        took = []
        for _ in range(SCRAPES):
            for conn in slow[: SLOW_HEADERS // 10]:  # keep dripping: one more header line
                with contextlib.suppress(OSError):
                    conn.sendall(b"x-drip: 1\r\n")
            took.append(timed_scrape(host, port, trust))
        assert time.monotonic() - opened_at < HEAD_DEADLINE_S, "the scrapes outlasted the attack"
        # The attackers were all held open by the daemon while it answered the scrapes.
        assert open_fds(pid) >= baseline_fds + SLOW_HEADERS + HALF_OPEN_TLS - 10
        assert sum(still_open(c) for c in slow) == SLOW_HEADERS
        assert sum(still_open(c) for c in half) == HALF_OPEN_TLS
        assert max(took) < SCRAPE_DEADLINE_S, [f"{t:.3f}" for t in took]
        # Past the deadlines (a head's, a handshake's), every attacker has been dropped.
        time.sleep(HEAD_DEADLINE_S - (time.monotonic() - half_opened_at) + 2)
        assert sum(still_open(c) for c in slow) == 0
        assert sum(still_open(c) for c in half) == 0
        assert timed_scrape(host, port, trust) < SCRAPE_DEADLINE_S


def send_unfinished_head(host: str, port: int, line: bytes, lines: int) -> str:
    """A request head of ``lines`` header lines, never ended by a blank line; how it ended."""
    with socket.create_connection((host, port), timeout=30) as conn:
        try:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            for _ in range(lines):
                conn.sendall(line)
        except OSError:
            return "refused while sending"
        conn.settimeout(30)
        try:
            answer = conn.recv(100)
        except OSError:
            return "reset"
        return answer.split(b"\r\n")[0].decode() or "closed"


def test_unfinished_huge_heads_leave_memory_within_budget(flight_dir: Path, tmp_path: Path) -> None:
    line = b"x-big: " + b"a" * (64 * 1024 - 9) + b"\r\n"  # 64 KiB a line, 99 lines: 6.3 MB
    with serve(flight_dir, *QUIET, log=tmp_path / "serve.log") as url:
        host, port = host_port(url)
        pid = serve_pid(port)
        outcomes: list[str] = []
        senders = [
            threading.Thread(
                target=lambda: outcomes.append(send_unfinished_head(host, port, line, 99))
            )
            for _ in range(UNFINISHED_HEADS)
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(60)
        assert len(outcomes) == UNFINISHED_HEADS
        assert all(
            o in ("HTTP/1.1 400 Bad Request", "refused while sending", "reset") for o in outcomes
        ), set(outcomes)
        peak = status_bytes(pid, "VmHWM")
        assert peak < RSS_BUDGET, f"peak RSS {peak / 2**20:.1f} MiB"
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200


def exchange(host: str, port: int, data: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(data)
        conn.settimeout(2)
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 51\r\nContent-Length: 0\r\n\r\n"
SECOND = b"GET /api/v1/boots HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def test_smuggling_control_characters_forged_log_lines_and_echoes(
    flight_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    with serve(flight_dir, *QUIET, "--log.level=debug", log=log) as url:
        host, port = host_port(url)
        # Conflicting lengths: refused and closed, so the "body" is never a second request.
        smuggled = exchange(host, port, SMUGGLED + SECOND)
        assert smuggled.startswith(b"HTTP/1.1 400 ") and b'"boots"' not in smuggled
        duplicate = GET_HEALTHZ + b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n"
        assert exchange(host, port, duplicate).startswith(b"HTTP/1.1 400 ")
        # NUL and control characters in a path: 400, never a 500 (nor a traceback).
        for target in (
            b"/static/%00",
            b"/static/app.js%00.map",
            b"/%00",
            b"/x%0aFORGED%20ERROR%20x",
        ):
            answer = exchange(host, port, b"GET " + target + b" HTTP/1.0\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400 "), (target, answer[:80])
        exchange(host, port, b"GET /nope%E2%80%A8FORGED HTTP/1.0\r\n\r\n")
        # An error echoes at most 200 bytes of what was sent.
        answer = exchange(
            host, port, b"GET /api/v1/census?limit=" + b"7" * 12_000 + b" HTTP/1.0\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 422 ") and b"7" * 201 not in answer
        assert b"7" * 150 in answer
    text = log.read_text()
    assert "Traceback" not in text
    assert not any(line.startswith(("FORGED", "\u2028")) for line in text.splitlines())
    assert "/x\\nFORGED ERROR x" in text and "/nope\\u2028FORGED" in text


GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize("users_first", [False, True])
def test_the_web_config_reloads_and_once_auth_is_on_it_stays_on(
    flight_dir: Path, tmp_path: Path, users_first: bool
) -> None:
    import bcrypt
    from tests.daemon.test_daemon_serve import get

    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    users = f"basic_auth_users:\n  alice: '{hashed}'\n"
    cfg = tmp_path / "web.yml"
    cfg.write_text(users if users_first else "")
    alice = {"Authorization": "Basic YWxpY2U6cHc="}  # alice:pw
    log = tmp_path / "serve.log"
    with serve(flight_dir, f"--web.config.file={cfg}", *QUIET, log=log) as url:
        assert get(url + "/healthz")[0] == (401 if users_first else 200)
        cfg.write_text(users + "# users added while serving\n")
        assert get(url + "/healthz")[0] == 401
        assert get(url + "/healthz", alice)[0] == 200
        cfg.write_text("basic_auth_users:\n  alice: [\n")  # does not parse
        assert get(url + "/metrics")[0] == 401
        assert get(url + "/metrics", alice)[0] == 200
        cfg.write_text("# no users any more\n")
        for path in ("/metrics", "/healthz", "/readyz", "/api/v1/boots", "/", "/static/app.js"):
            assert get(url + path)[0] == 401, path
    text = log.read_text()
    assert "cannot be used, keeping the last good one" in text
    assert "basic auth stays on" in text


def test_a_flood_of_bad_requests_does_not_flood_the_log(flight_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve(flight_dir, *QUIET, log=log) as url:
        host, port = host_port(url)
        for _ in range(50):
            assert exchange(host, port, b"GET /x HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    lines = log.read_text().splitlines()
    assert len(lines) < 10 and not any("Invalid HTTP request" in line for line in lines), lines
