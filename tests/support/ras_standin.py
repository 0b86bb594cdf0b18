"""A STAND-IN for an NCCL RAS endpoint (NCCL needs a GPU; none here): a local TCP server
that speaks RAS's client protocol as NCCL 2.28.9 answered it on the GPU machine (the
handshake answers are replayed byte-for-byte from the captured fixtures) and then sends a
report given as bytes, or misbehaves in one of the ways an untrusted endpoint can.

Modes: "replay" (the protocol, then the report, then EOF); "silent" (accepts and never
answers); "dribble" (the protocol, then the report one byte every ``dribble_s``);
"protocol3" (answers ``SERVER PROTOCOL 3``); "pre2287" (answers ``SET FORMAT json`` as
NCCL before 2.28.7 does, with ``ERROR: Unknown command``); "reset" (half the report, then
a TCP reset).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl_ras"
HANDSHAKE = (FIXTURES / "ras-2.28.9-handshake.reply0-client-protocol-2.txt").read_bytes()
FORMAT_OK = (FIXTURES / "ras-2.28.9-status-json.reply1-set-format-json.txt").read_bytes()


class StandInRas:
    """STAND-IN RAS server on 127.0.0.1 (a free port); ``reports`` are sent in turn, one per
    connection (the last one repeats), as a shared SO_REUSEPORT port answers for jobs in turn."""

    def __init__(self, *reports: bytes, mode: str = "replay", dribble_s: float = 0.2) -> None:
        self.reports = list(reports) or [b""]
        self.mode = mode
        self.dribble_s = dribble_s
        self.connections = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.05)  # so the accept loop sees the stop promptly
        self.port = self._sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="standin-ras")

    def __enter__(self) -> StandInRas:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            report = self.reports[min(self.connections, len(self.reports) - 1)]
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn, report), daemon=True).start()

    def _answer(self, conn: socket.socket, report: bytes) -> None:
        with conn:
            try:
                if self.mode == "silent":
                    self._stop.wait(30)
                    return
                reader = conn.makefile("rb")
                for line in reader:
                    command = line.strip().upper()
                    if command.startswith(b"CLIENT PROTOCOL"):
                        reply = b"SERVER PROTOCOL 3\n" if self.mode == "protocol3" else HANDSHAKE
                        conn.sendall(reply)
                    elif command.startswith(b"SET FORMAT"):
                        if self.mode == "pre2287":
                            conn.sendall(b"ERROR: Unknown command " + line.strip() + b"\n")
                        else:
                            conn.sendall(FORMAT_OK)
                    elif command == b"STATUS":
                        if self.mode == "reset":
                            conn.sendall(report[: len(report) // 2])
                            # SO_LINGER 0: close sends RST, not FIN.
                            conn.setsockopt(
                                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                            )
                            return
                        if self.mode == "dribble":
                            for i in range(len(report)):
                                if self._stop.is_set():
                                    return
                                conn.sendall(report[i : i + 1])
                                time.sleep(self.dribble_s)
                        else:
                            conn.sendall(report)
                        return
            except OSError:
                return  # the client gave up: that is its right
