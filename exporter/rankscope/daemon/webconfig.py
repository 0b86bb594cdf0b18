"""The exporter-toolkit web configuration (--web.config.file, docs/daemon.md): TLS, basic
auth with bcrypt hashes and response headers, parsed as exporter-toolkit's Go
code parses them (its web/testdata is the oracle: tests/faults/test_fault_webconfig_oracle.py).
An unknown or repeated key is an error, so a typo never leaves the daemon open.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rankscope.daemon.webconfig_tls import HTTP2_REQUIRED_CIPHERS, TLSConfig, parse_tls
from rankscope.daemon.webconfig_yaml import Reader, WebConfigError, is_null

# The headers exporter-toolkit lets a web config set, with the only values it allows (None:
# any value). Names are matched exactly, as Go does.
ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
_TOP_KEYS = ("tls_server_config", "http_server_config", "rate_limit", "basic_auth_users")
# A whole bcrypt hash: $2a$/$2b$/$2y$, a two-digit cost, 22 characters of salt and 31 of hash.
_BCRYPT = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
_PRINTABLE = re.compile(r"[\t\x20-\x7e]*")


@dataclass(frozen=True)
class WebConfig:
    tls: TLSConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)  # name -> value, as sent
    http2: bool = True  # accepted as Go accepts it; the daemon speaks HTTP/1.1 either way


def parse_web_config(text: str, base_dir: Path, source: str = "web config") -> WebConfig:
    """Parse the YAML of a web config; paths resolve against ``base_dir``. Files are not
    read here (load_web_config checks them)."""
    reader = Reader(source)
    top = reader.mapping(reader.document(text), "the top level", _TOP_KEYS)
    tls = parse_tls(reader, top.get("tls_server_config"), base_dir)
    _check_rate_limit(reader, top.get("rate_limit"))
    http_node = top.get("http_server_config")
    http = reader.mapping(http_node, "http_server_config", ("http2", "headers"))
    # A null section is Go's zero value, http2 false; an absent one keeps the default.
    http2_default = http_node is None or not is_null(http_node)
    http2 = reader.boolean(http.get("http2"), "http_server_config.http2", http2_default)
    # Go's net/http refuses to start HTTP/2 with TLS 1.2 cipher suites that lack the one
    # HTTP/2 requires; the same file is refused here, so it behaves the same in both.
    tls12_ciphers = tls.cipher_suites if tls is not None and tls.min_version != "TLS13" else ()
    if http2 and tls12_ciphers and not set(tls12_ciphers) & set(HTTP2_REQUIRED_CIPHERS):
        raise reader.error(
            "http2: TLSConfig.CipherSuites is missing an HTTP/2-required AES_128_GCM_SHA256 "
            f"cipher (need at least one of {' or '.join(HTTP2_REQUIRED_CIPHERS)}); add one "
            "or set http_server_config.http2: false"
        )
    return WebConfig(
        tls=tls,
        users=_users(reader, top.get("basic_auth_users")),
        headers=_headers(reader, http.get("headers")),
        http2=http2,
    )


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {p}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"web config {p} is not UTF-8 text: {exc}") from exc
    config = parse_web_config(text, p.parent, str(p))
    if config.tls is not None:
        for name, f in config.tls.files.items():
            if not f.is_file():
                problem = "is not a regular file" if f.exists() else "does not exist"
                raise WebConfigError(f"{p}: tls_server_config.{name} {f} {problem}")
    return config


def _users(reader: Reader, node: yaml.Node | None) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for user, value in reader.mapping(node, "basic_auth_users").items():
        hashed = reader.string(value, f"basic_auth_users.{user}")
        problem = _bcrypt_problem(hashed)
        if problem:
            raise reader.error(f"basic_auth_users.{user} is not a bcrypt hash: {problem}")
        users[user] = hashed.encode()
    return users


def _bcrypt_problem(hashed: str) -> str | None:
    """Why ``hashed`` is not a whole bcrypt hash (Go refuses one that is too short and
    starts anyway with other damage, then refuses every password: refused here at once)."""
    if len(hashed) != 60:
        return f"{len(hashed)} characters where bcrypt has 60 (cut or padded?)"
    found = _BCRYPT.fullmatch(hashed)
    if found is None:
        return "expected $2a$, $2b$ or $2y$, a two-digit cost and 53 characters of [./A-Za-z0-9]"
    if not 4 <= int(found.group(1)) <= 31:
        return f"cost {found.group(1)} is outside bcrypt's 04..31"
    return None


def _headers(reader: Reader, node: yaml.Node | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value_node in reader.mapping(node, "http_server_config.headers").items():
        if name not in ALLOWED_HEADERS:
            raise reader.error(
                f"HTTP header {name!r} can not be configured (allowed: {', '.join(ALLOWED_HEADERS)})"
            )
        value = reader.string(value_node, f"http_server_config.headers.{name}")
        allowed = ALLOWED_HEADERS[name]
        if allowed is not None and value not in allowed:
            raise reader.error(
                f"invalid value for {name}. Expected one of: {list(allowed)}, but got: {value!r}"
            )
        # Go's net/http writes CR and LF in a value as spaces (a folded YAML scalar ends in
        # one); leading and trailing blanks are not part of an HTTP field value.
        value = value.replace("\r", " ").replace("\n", " ").strip(" \t")
        if not _PRINTABLE.fullmatch(value):
            raise reader.error(
                f"http_server_config.headers.{name} must be printable ASCII (got {value!r})"
            )
        headers[name] = value
    return headers


def _check_rate_limit(reader: Reader, node: yaml.Node | None) -> None:
    """Read as Go reads it; a limit that is on is refused, since the daemon has no rate
    limiter and serving without the limit the file asks for would protect less."""
    raw = reader.mapping(node, "rate_limit", ("burst", "interval"))
    interval = reader.duration(raw.get("interval"), "rate_limit.interval")
    reader.integer(raw.get("burst"), "rate_limit.burst")
    # Go: an interval of 0 turns the limiter off; a negative one limits nothing.
    if interval > 0:
        raise reader.error(
            "rate_limit is not supported: rankscope serve has no rate limiter (set interval "
            "to 0, or limit at a proxy in front of it)"
        )
