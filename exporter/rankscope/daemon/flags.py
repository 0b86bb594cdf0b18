"""Flag values: durations ('100ms', '1m30s') and byte sizes ('2GiB', '1.5GB'). Each parse
function raises ValueError saying what it accepts; :func:`argtype` makes it a ``type=``."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Prometheus-style durations -> seconds: '100ms', '15s', '1m30s', '0.5s', '7d', '2w'."""
    raw = text.strip()
    parts = _DURATION_PART.findall(raw)
    if not raw or "".join(n + u for n, u in parts) != raw:
        raise ValueError(f"{text!r} is not a duration (examples: 100ms, 15s, 1m30s)")
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds


def argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def parse_host_port(text: str, flag: str, any_host: str = "") -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); ':PORT' -> ``any_host`` where one is given."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not (host or any_host):
        raise ValueError(f"{flag} {text!r}: expected HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{flag} {text!r}: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or any_host, port


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{text!r}: must be at least 1")
    return value


_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2,
    "gi": 1024**3, "gib": 1024**3, "ti": 1024**4, "tib": 1024**4,
}  # fmt: skip


def parse_bytes(text: str | int) -> int:
    """'2GiB', '1.5GB', '512Mi', '1048576' -> bytes (SI units of 1000, IEC of 1024); an int
    as it is (exact below 2**53 bytes, 8 PiB)."""
    raw = str(text).strip()
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    unit = raw[len(number) :].strip().lower()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(
            f"{text!r} is not a byte size (examples: 2GiB, 1.5GB, 512MiB, 1048576)"
        ) from None
    if value < 0 or value != value or value == float("inf"):
        raise ValueError(f"{text!r}: a byte size must be a finite, non-negative number")
    return round(value)


def positive_bytes(text: str) -> int:
    if (value := parse_bytes(text)) < 1:
        raise ValueError(f"{text!r}: must be a positive number of bytes")
    return value
