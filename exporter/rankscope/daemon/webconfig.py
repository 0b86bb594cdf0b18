"""The exporter-toolkit web configuration (--web.config.file, docs/daemon.md): TLS, basic auth
with bcrypt hashes and response headers, parsed as exporter-toolkit's Go code (yaml.v2's
UnmarshalStrict) parses them; its web/testdata is the oracle of test_fault_webconfig_oracle.py.
An unknown or repeated key is an error, so a typo or a second, empty `basic_auth_users:` never
leaves the daemon open; each scalar converts as a Go field of its type takes it."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from rankscope.daemon.webconfig_tls import (
    CIPHER_SUITES,
    CLIENT_AUTH,
    CURVES,
    HTTP2_REQUIRED_CIPHERS,
    TLS_VERSIONS,
    TLSConfig,
)

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
# yaml.v2 reads these plain scalars as booleans (YAML 1.1); PyYAML leaves out y/Y/n/N.
_TRUE = frozenset(["y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"])
_FALSE = frozenset(["n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"])
# Go's time.ParseDuration: a sequence of decimal numbers, each with a unit.
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
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
_CLIENT_AUTH_ALIASES = {"": "NoClientCert", "RequireClientCert": "RequireAnyClientCert"}
# Each PEM is inline or in a file; these and the client auth type turn TLS on in Go
# (TLSConfig.IsEnabled), the other keys are TLSConfig's settings.
_PEMS = ("cert", "key", "client_ca")
_ENABLING = (*_PEMS, *(f"{pem}_file" for pem in _PEMS), "client_auth_type")
# The keys of tls_server_config: TLSConfig's fields, and one refused with a reason.
TLS_KEYS = (*(f.name for f in fields(TLSConfig)), "client_allowed_sans")


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and the key."""


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
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise reader.error(f"not valid YAML: {exc}") from exc
    top = reader.mapping(document, "the top level", _TOP_KEYS)
    tls = parse_tls(reader, top.get("tls_server_config"), base_dir)
    # rate_limit is read as Go reads it, and a limit that is on refused: the daemon has no
    # rate limiter, and serving without the limit the file asks for would protect less.
    rate = reader.mapping(top.get("rate_limit"), "rate_limit", ("burst", "interval"))
    interval = reader.duration(rate.get("interval"), "rate_limit.interval")
    reader.integer(rate.get("burst"), "rate_limit.burst")
    if interval > 0:  # Go: 0 turns the limiter off, a negative interval limits nothing
        raise reader.error(
            "rate_limit is not supported: rankscope serve has no rate limiter (set interval "
            "to 0, or limit at a proxy in front of it)"
        )
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


def load_web_config(p: Path) -> WebConfig:
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
        if problem := _bcrypt_problem(hashed):
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


def parse_tls(reader: Reader, node: yaml.Node | None, base_dir: Path) -> TLSConfig | None:
    """The TLS settings, None when the file asks for none."""
    where = "tls_server_config"
    raw = reader.mapping(node, where, TLS_KEYS)
    text = {k: reader.string(raw.get(k), f"{where}.{k}") for k in _ENABLING}
    if not any(text.values()):
        if raw:
            # Go serves plain HTTP here and ignores these settings; refusing keeps a file
            # that asked for TLS from being served without it.
            raise reader.error(
                f"{where} sets {', '.join(sorted(raw))} but no certificate: "
                "set cert_file and key_file (or cert and key)"
            )
        return None
    for pem in ("cert", "key"):
        if not text[f"{pem}_file"] and not text[pem]:
            raise reader.error(f"{where}: missing one of {pem} or {pem}_file")
    auth = _client_auth(reader, text)
    if reader.strings(raw.get("client_allowed_sans"), f"{where}.client_allowed_sans"):
        raise reader.error(
            f"{where}.client_allowed_sans is not supported: Python's ssl module gives no "
            "hook to check the client certificate's SANs during the handshake; list the "
            "allowed clients' CA in client_ca_file instead"
        )
    low, high = (
        _version(reader, raw.get(k), f"{where}.{k}", getattr(TLSConfig, k))
        for k in ("min_version", "max_version")
    )
    if TLS_VERSIONS[low] > TLS_VERSIONS[high]:
        raise reader.error(
            f"{where}: min_version {low} is above max_version {high}; no client could connect"
        )
    pems: dict[str, Any] = {}  # each from its file or inline: the file wins, as in Go
    for pem in _PEMS:
        file = text[f"{pem}_file"]
        pems.update({f"{pem}_file": base_dir / file} if file else {pem: text[pem] or None})
    return TLSConfig(
        **pems,
        client_auth_type=auth,
        cipher_suites=_names(reader, raw, "cipher_suites", "cipher", CIPHER_SUITES),
        curve_preferences=_names(reader, raw, "curve_preferences", "curve", CURVES),
        min_version=low,
        max_version=high,
        prefer_server_cipher_suites=reader.boolean(
            raw.get("prefer_server_cipher_suites"), f"{where}.prefer_server_cipher_suites", True
        ),
    )


def _client_auth(reader: Reader, text: dict[str, str]) -> str:
    given = text["client_auth_type"]
    auth = _CLIENT_AUTH_ALIASES.get(given, given)
    if auth not in CLIENT_AUTH:
        raise reader.error(
            f"invalid ClientAuth: tls_server_config.client_auth_type {given!r} is not one "
            f"of {', '.join(CLIENT_AUTH)}"
        )
    has_ca = bool(text["client_ca_file"] or text["client_ca"])
    if has_ca and auth == "NoClientCert":
        # Go's own refusal: a CA without a policy would serve clients without certificates.
        raise reader.error(
            "client CA's have been configured without a Client Auth Policy: set "
            "tls_server_config.client_auth_type (RequireAndVerifyClientCert to require one)"
        )
    if CLIENT_AUTH[auth] == ssl.CERT_REQUIRED and not has_ca:
        raise reader.error(
            f"tls_server_config.client_auth_type {auth} needs client_ca_file (or client_ca): "
            "without it Go trusts the system's public CAs, and Python's ssl module cannot "
            "accept a certificate it has not verified"
        )
    return auth


def _version(reader: Reader, node: yaml.Node | None, where: str, default: str) -> str:
    if node is None:
        return default
    value = reader.string(node, where)
    if value not in TLS_VERSIONS:
        raise reader.error(
            f"unknown TLS version: {where} {value!r} is not one of {', '.join(TLS_VERSIONS)}"
        )
    return value


def _names(
    reader: Reader, raw: dict[str, yaml.Node], key: str, kind: str, known: Mapping[str, object]
) -> tuple[str, ...]:
    where = f"tls_server_config.{key}"
    names = reader.strings(raw.get(key), where)
    for name in names:
        if name not in known:
            raise reader.error(f"unknown {kind}: {name!r} in {where} (known: {', '.join(known)})")
    return names


class Reader:
    """Typed reads of a composed YAML document; every error names ``source`` and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, message: str) -> WebConfigError:
        return WebConfigError(f"{self.source}: {message}")

    def mapping(
        self, node: yaml.Node | None, where: str, allowed: tuple[str, ...] | None = None
    ) -> dict[str, yaml.Node]:
        """The keys of a mapping (none for null); ``allowed`` None takes any key."""
        if node is None or is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{where} must be a mapping")
        out: dict[str, yaml.Node] = {}
        for key_node, value in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                raise self.error(f"{where} has a key that is not a plain name")
            key = key_node.value
            if key in out:
                raise self.error(
                    f"{key!r} appears twice in {where} (line {key_node.start_mark.line + 1}); "
                    "one would silently override the other"
                )
            out[key] = value
        if allowed is not None and (unknown := sorted(k for k in out if k not in allowed)):
            raise self.error(
                f"unknown key(s) {', '.join(unknown)} in {where} (known: {', '.join(allowed)})"
            )
        return out

    def string(self, node: yaml.Node | None, where: str) -> str:
        """Any scalar's text, as a Go string field takes it; "" for null or absent."""
        if node is None or is_null(node):
            return ""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(f"{where} must be a string")
        return str(node.value)

    def strings(self, node: yaml.Node | None, where: str) -> tuple[str, ...]:
        if node is None or is_null(node):
            return ()
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(f"{where} must be a list")
        return tuple(self.string(item, f"{where}[{i}]") for i, item in enumerate(node.value))

    def boolean(self, node: yaml.Node | None, where: str, default: bool) -> bool:
        if node is None:
            return default
        if is_null(node):
            return False  # yaml.v2 sets the zero value
        plain = isinstance(node, yaml.ScalarNode) and (node.style is None or node.tag == _BOOL)
        if plain and node.value in _TRUE | _FALSE:
            return node.value in _TRUE
        raise self.error(f"{where} must be true or false, not {_shown(node)}")

    def integer(self, node: yaml.Node | None, where: str) -> int:
        if node is None or is_null(node):
            return 0
        if isinstance(node, yaml.ScalarNode) and node.tag == _INT:
            return yaml.SafeLoader("").construct_yaml_int(node)
        raise self.error(f"{where} must be an integer, not {_shown(node)}")

    def duration(self, node: yaml.Node | None, where: str) -> float:
        """Seconds, from a Go duration ("1m30s") or an integer of nanoseconds, as yaml.v2
        reads a time.Duration."""
        if node is None or is_null(node) or node.tag == _INT:
            return self.integer(node, where) * 1e-9
        text = self.string(node, where)
        if (seconds := go_duration(text)) is None:
            raise self.error(f"{where} {text!r} is not a duration (like 1s, 500ms, 1m30s)")
        return seconds


def is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration string, None when Go's time.ParseDuration refuses it."""
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in "+-" else text
    body = body.replace("µ", "u").replace("μ", "u")  # Go takes either micro sign for us
    if body == "0":
        return 0.0
    if not body or _DURATION_PART.sub("", body):
        return None
    return sign * sum(
        float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(body)
    )


def _shown(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return repr(node.value[:40])
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
