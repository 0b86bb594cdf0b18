"""The NCCL RAS source: polls each endpoint (untrusted: every step has a deadline, the report
a byte cap; docs/nccl-ras-notes.md) and keeps the last parsed report for the scrape. Jobs
may share the default port, so a communicator is kept until absent ``forget_after`` polls."""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

from rankscope.daemon.flags import parse_host_port
from rankscope.daemon.nccl_ras_report import (
    ERROR_REASONS,
    KNOWN_PROTOCOL,
    Communicator,
    RasReport,
    ReportError,
    count_mismatches,
    parse_report,
    status_differs,
)
from rankscope.daemon.sampler import Periodic

log = logging.getLogger("rankscope.daemon")

DEFAULT_ADDRESS = "localhost:28028"
CONNECT_TIMEOUT_S = 2.0
LINE_TIMEOUT_S = 3.0  # each setup line's answer
REPORT_TIMEOUT_S = 12.0  # NCCL waits up to 5 s per leg + 5 s for its peers (ras_internal.h)
DEFAULT_MAX_BYTES = 16 << 20
MAX_LINE_BYTES = 4096
DEFAULT_PERSIST_POLLS = 3


def parse_address(text: str) -> tuple[str, int]:
    """A RAS server's address: its port in digits, 1..65535 (no ':0' to listen on)."""
    host, port = parse_host_port(text, "--collector.nccl-ras.address")
    if not text.rpartition(":")[2].isdigit() or port == 0:
        raise ValueError(f"--collector.nccl-ras.address {text!r}: port must be 1..65535")
    return host, port


def _recv_line(sock: socket.socket, buf: bytearray, seconds: float) -> str:
    end = time.monotonic() + seconds
    while b"\n" not in buf:
        if len(buf) > MAX_LINE_BYTES:
            raise ReportError("malformed", "setup answer longer than a line")
        chunk = _recv(sock, end)
        if not chunk:
            raise ReportError("truncated", "connection closed during the handshake")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line.decode("utf-8", "replace").strip()


def _recv(sock: socket.socket, end: float) -> bytes:
    """What the socket has by monotonic time ``end`` (query maps its OSErrors to reasons)."""
    left = end - time.monotonic()
    if left <= 0:
        raise ReportError("timeout", "deadline passed")
    sock.settimeout(left)
    return sock.recv(65536)


def query(
    address: tuple[str, int],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    report_timeout: float = REPORT_TIMEOUT_S,
) -> bytes:
    """One status report as sent (JSON where the server takes it); ReportError otherwise."""
    try:
        sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
    except ConnectionRefusedError:
        raise ReportError("refused", f"{address[0]}:{address[1]} refused") from None
    except TimeoutError:
        raise ReportError("timeout", "connect timed out") from None
    except OSError as exc:
        raise ReportError("refused", f"connect: {exc.strerror or exc}") from None
    with sock:
        buf = bytearray()
        try:
            sock.sendall(f"CLIENT PROTOCOL {KNOWN_PROTOCOL}\n".encode())
            answer = _recv_line(sock, buf, LINE_TIMEOUT_S)
            if not answer.upper().startswith("SERVER PROTOCOL "):
                raise ReportError("malformed", f"handshake answer {answer[:60]!r}")
            if answer.split()[-1] != str(KNOWN_PROTOCOL):
                raise ReportError("unknown_version", f"server speaks {answer[:60]!r}")
            sock.sendall(b"SET FORMAT json\n")
            # "OK" (2.28.7+) or "ERROR: Unknown command" (older): STATUS then gives text.
            _recv_line(sock, buf, LINE_TIMEOUT_S)
            sock.sendall(b"STATUS\n")
            end = time.monotonic() + report_timeout
            while chunk := _recv(sock, end):
                buf += chunk
                if len(buf) > max_bytes:
                    raise ReportError("too_large", f"report over {max_bytes} bytes")
        except TimeoutError:
            raise ReportError("timeout", "no answer within the deadline") from None
        except OSError as exc:  # reset or broken pipe mid-exchange
            raise ReportError("truncated", f"connection lost: {exc}") from None
        if not buf:
            raise ReportError("truncated", "no report after STATUS")
        return bytes(buf)


@dataclass
class CommState:
    comm: Communicator
    last_seen_poll: int
    # op (or "status") -> (successive polls the op disagreed, lowest count at the first)
    streaks: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class EndpointView:
    address: str
    polls: int
    last_success: bool | None  # None before the first poll
    last_duration: float | None
    last_error: str | None  # a reason of ERROR_REASONS
    errors: dict[str, int]
    report: RasReport | None  # the last report that parsed
    comms: tuple[CommState, ...]
    persisting: dict[tuple[str, str], tuple[str, ...]]  # comm key -> persisting mismatches


class Endpoint:
    """Poll state of one address; ``poll_once`` is the whole cycle (tests drive it). Only its
    poller thread polls; a scrape reads the ``view`` it last published."""

    def __init__(
        self,
        address: str,
        *,
        persist_polls: int = DEFAULT_PERSIST_POLLS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        report_timeout: float = REPORT_TIMEOUT_S,
    ) -> None:
        self.address = address
        target = parse_address(address)
        self._fetch = lambda: query(target, max_bytes=max_bytes, report_timeout=report_timeout)
        self.persist_polls = persist_polls
        self.forget_after = max(10, 4 * persist_polls)
        self._comms: dict[tuple[str, str], CommState] = {}
        errors = dict.fromkeys(ERROR_REASONS, 0)
        self.view = EndpointView(address, 0, None, None, None, errors, None, (), {})

    def poll_once(self) -> None:
        start = time.perf_counter()
        report: RasReport | None = None
        error = None
        try:
            report = parse_report(self._fetch())
        except ReportError as exc:
            error = exc.reason
            log.debug("nccl-ras %s: %s", self.address, exc)
        except Exception as exc:  # an endpoint must never stop the thread
            error = "malformed"
            log.warning("nccl-ras %s: unexpected %r", self.address, exc)
        elapsed = time.perf_counter() - start
        old = self.view
        errors = {reason: n + (reason == error) for reason, n in old.errors.items()}
        if report is not None:
            self._merge(report, old.polls + 1)
        comms = tuple(self._comms.values())
        persisting = {
            s.comm.key: tuple(op for op, (n, _) in s.streaks.items() if n >= self.persist_polls)
            for s in comms
        }
        self.view = EndpointView(
            self.address, old.polls + 1, error is None, elapsed, error, errors,
            report or old.report, comms, persisting,
        )  # fmt: skip

    def _merge(self, report: RasReport, n: int) -> None:
        for comm in report.communicators:
            held = self._comms.get(comm.key)
            found: dict[str, int] = {op: low for op, (low, _high) in count_mismatches(comm).items()}
            if status_differs(comm):
                found["status"] = 0
            for op in comm.reported_mismatches:
                found.setdefault(op, -1)
            prior = held.streaks if held else {}
            # A count mismatch persists only while the laggards stay put: ranks in flight
            # show different counts at every poll, but their lowest count moves.
            streaks = {
                op: (prior[op][0] + 1 if op in prior and prior[op][1] == low else 1, low)
                for op, low in found.items()
            }
            self._comms[comm.key] = CommState(comm, n, streaks)
        for key in [k for k, s in self._comms.items() if n - s.last_seen_poll >= self.forget_after]:
            del self._comms[key]


def pollers(endpoints: list[Endpoint], interval: float) -> list[Periodic]:
    """A thread per endpoint: one that hangs until its deadline delays no other. A poll in
    progress ends at its own deadline at worst: a stop waits for it briefly. Each waits the
    interval after its poll: the RAS server runs inside the training ranks."""
    return [
        Periodic("rankscope-nccl-ras", interval, e.poll_once, stop_wait=1.0, after_each=True)
        for e in endpoints
    ]
