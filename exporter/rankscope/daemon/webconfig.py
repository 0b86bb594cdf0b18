"""The exporter-toolkit web configuration (--web.config.file, docs/daemon.md): TLS, basic
auth with bcrypt hashes, and response headers. An unknown key is an error, so a typo never
leaves the daemon open. The users are read again when the file changes; TLS settings need a
restart.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import os
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rankscope.daemon.httpserver import App, HTTPError, Request, Response

log = logging.getLogger("rankscope.daemon")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# exporter-toolkit's client_auth_type values, as Python's ssl module can honour them.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# The headers exporter-toolkit lets a web config set.
ALLOWED_HEADERS = (
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
)
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
_HTTP_KEYS = ("headers", "http2")


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class TLSConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None

    @property
    def cert_reqs(self) -> int:
        return int(CLIENT_AUTH[self.client_auth_type])

    def expired(self, now: float) -> str | None:
        """When the certificate's validity ended, if it has (served all the same: refusing
        to start would turn an expiry into an outage of the metrics)."""
        try:
            # The stdlib's only certificate decoder without a handshake.
            not_after = ssl._ssl._test_decode_cert(str(self.cert_file))["notAfter"]  # type: ignore[attr-defined]
        except (OSError, ValueError, KeyError, AttributeError):
            return None
        return not_after if ssl.cert_time_to_seconds(not_after) < now else None

    def context(self) -> ssl.SSLContext:
        """The server's TLS context; ssl.SSLError when the files cannot serve together."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        context.verify_mode = ssl.VerifyMode(self.cert_reqs)
        if self.client_ca_file is not None:
            context.load_verify_locations(cafile=str(self.client_ca_file))
        context.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version is not None:
            context.maximum_version = TLS_VERSIONS[self.max_version]
        return context


_TLS_KEYS = tuple(f.name for f in fields(TLSConfig))


@dataclass(frozen=True)
class WebConfig:
    tls: TLSConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)


def parse_web_config(text: str, base_dir: Path, source: str = "web config") -> WebConfig:
    """Parse the YAML of a web config; paths resolve against ``base_dir``."""
    import yaml  # only a daemon given --web.config.file loads it

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{source}: not valid YAML: {exc}") from exc
    if doc is None:
        return WebConfig()
    top = _mapping(doc, source, "the top level", _TOP_KEYS)
    tls_raw = top.get("tls_server_config")
    tls = _parse_tls(tls_raw, base_dir, source) if tls_raw is not None else None
    headers: dict[str, str] = {}
    if top.get("http_server_config") is not None:
        http = _mapping(top["http_server_config"], source, "http_server_config", _HTTP_KEYS)
        raw_headers = http.get("headers") or {}
        if not isinstance(raw_headers, dict):
            raise WebConfigError(f"{source}: http_server_config.headers must be a mapping")
        for name, value in raw_headers.items():
            canonical = next((h for h in ALLOWED_HEADERS if h.lower() == str(name).lower()), None)
            if canonical is None:
                raise WebConfigError(
                    f"{source}: header {name!r} cannot be set here (allowed: {', '.join(ALLOWED_HEADERS)})"
                )
            headers[canonical] = str(value)
    users: dict[str, bytes] = {}
    raw_users = top.get("basic_auth_users") or {}
    if not isinstance(raw_users, dict):
        raise WebConfigError(f"{source}: basic_auth_users must map user names to bcrypt hashes")
    for user, hashed in raw_users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{source}: basic_auth_users.{user} is not a bcrypt hash")
        users[str(user)] = hashed.encode()
    return WebConfig(tls=tls, users=users, headers=headers)


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {p}: {exc.strerror or exc}") from exc
    config = parse_web_config(text, p.parent, str(p))
    if config.tls is not None:
        for name in ("cert_file", "key_file", "client_ca_file"):
            f = getattr(config.tls, name)
            if f is not None and not f.is_file():
                raise WebConfigError(f"{p}: tls_server_config.{name} {f} does not exist")
    return config


def _mapping(value: Any, source: str, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WebConfigError(f"{source}: {where} must be a mapping")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise WebConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)} in {where} (known: {', '.join(allowed)})"
        )
    return value


def _parse_tls(tls_raw: object, base_dir: Path, source: str) -> TLSConfig:
    raw = _mapping(tls_raw, source, "tls_server_config", _TLS_KEYS)
    for required in ("cert_file", "key_file"):
        if not raw.get(required):
            raise WebConfigError(f"{source}: tls_server_config needs {required}")
    auth = raw.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise WebConfigError(
            f"{source}: client_auth_type {auth!r} is not one of {', '.join(CLIENT_AUTH)}"
        )
    ca = raw.get("client_ca_file")
    if CLIENT_AUTH[auth] != ssl.CERT_NONE and not ca:
        raise WebConfigError(f"{source}: client_auth_type {auth} needs client_ca_file")
    for bound in ("min_version", "max_version"):
        if raw.get(bound) is not None and raw[bound] not in TLS_VERSIONS:
            raise WebConfigError(
                f"{source}: {bound} {raw[bound]!r} is not one of {', '.join(TLS_VERSIONS)}"
            )
    return TLSConfig(
        cert_file=base_dir / str(raw["cert_file"]),
        key_file=base_dir / str(raw["key_file"]),
        client_auth_type=auth,
        client_ca_file=base_dir / str(ca) if ca else None,
        min_version=raw.get("min_version") or "TLS12",
        max_version=raw.get("max_version"),
    )


@functools.cache
def dummy_hash() -> bytes:
    """Checked for an unknown user, so the response time does not tell which users exist;
    made on first use, so a daemon without basic auth never loads bcrypt."""
    import bcrypt

    return bcrypt.hashpw(b"rankscope: no such user", bcrypt.gensalt(rounds=10))


_CACHE_SIZE = 256


class BasicAuth:
    """Checks an Authorization header against the users. Outcomes are cached by a digest of
    (user, hash, password), as exporter-toolkit does: a scraper pays for bcrypt once."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = dict(users)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def check(self, authorization: bytes | None) -> bool:
        user, password = parse_basic(authorization)
        hashed = self.users.get(user) if user is not None else None
        known = hashed is not None
        hashed = hashed if hashed is not None else dummy_hash()
        pw = (password or "").encode()
        key = hashlib.sha256(b"\0".join([(user or "").encode(), hashed, pw])).digest()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        import bcrypt

        try:
            matches = bcrypt.checkpw(pw, hashed)
        except ValueError:  # a malformed hash in the config
            matches = False
        ok = known and matches and user is not None
        with self._lock:
            self._cache[key] = ok
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return ok


def parse_basic(authorization: bytes | None) -> tuple[str | None, str | None]:
    """(user, password) of a Basic Authorization header, (None, None) for anything else."""
    if not authorization:
        return None, None
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() != b"basic":
        return None, None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else (None, None)


class ReloadingAuth:
    """The users of a web config file, read again when it changes (kept if it breaks)."""

    def __init__(self, path: Path, config: WebConfig) -> None:
        self.path = path
        self._auth = BasicAuth(config.users)
        self._mtime = _mtime(path)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._current().users)

    def check(self, authorization: bytes | None) -> bool:
        return self._current().check(authorization)

    def _current(self) -> BasicAuth:
        mtime = _mtime(self.path)
        with self._lock:
            if mtime == self._mtime:
                return self._auth
            self._mtime = mtime
            try:
                users = load_web_config(self.path).users
            except WebConfigError as exc:
                log.error(
                    "web config %s changed but cannot be used, keeping the previous users: %s",
                    self.path,
                    exc,
                )
                return self._auth
            if self._auth.users and not users:
                log.warning(
                    "web config %s changed: basic_auth_users is now empty, so every "
                    "request is served WITHOUT authentication",
                    self.path,
                )
            else:
                log.info("web config %s changed: %d user(s)", self.path, len(users))
            self._auth = BasicAuth(users)
            return self._auth


def _mtime(path: Path) -> tuple[int, int] | None:
    # With the size: a rewrite within one tick of a coarse file-system clock still shows.
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class WebConfigMiddleware:
    """Basic auth on every path and the configured headers on every answer, refusals too."""

    def __init__(
        self, app: App, auth: ReloadingAuth | BasicAuth | None, headers: dict[str, str]
    ) -> None:
        self.app = app
        self.auth = auth
        self.headers = dict(headers)

    def __call__(self, request: Request) -> Response:
        if self.auth is not None and self.auth.enabled:
            header = request.headers.get("authorization")
            # RequestHandler decodes headers as latin-1: this gives back the bytes sent.
            if not self.auth.check(header.encode("latin-1") if header is not None else None):
                response = Response(401, b"Unauthorized\n")
                response.headers["WWW-Authenticate"] = 'Basic realm="rankscope"'
                response.headers.update(self.headers)
                return response
        try:
            response = self.app(request)
        except HTTPError as exc:
            response = exc.response()
        response.headers.update(self.headers)
        return response


def with_web_config(app: App, path: Path) -> tuple[App, TLSConfig | None]:
    """``app`` behind the web config at ``path``, and the TLS settings to serve it with."""
    web = load_web_config(path)
    if web.users or web.headers:
        auth = ReloadingAuth(path, web) if web.users else None
        app = WebConfigMiddleware(app, auth, web.headers)
    return app, web.tls
