"""The web config at run time (--web.config.file, docs/daemon.md): basic auth with bcrypt
and the configured response headers, as an ASGI layer over the app. The file is read again
when it changes: users added turn auth on, a file that cannot be used keeps the last good
config (the error logged), and once auth has been on no route is served without it. Its
TLS settings are read from here too, for each new connection (webconfig_tls.LiveContext).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from rankscope.daemon.guard import plain
from rankscope.daemon.webconfig import WebConfig, WebConfigError, load_web_config
from rankscope.daemon.webconfig_tls import stamp

log = logging.getLogger("rankscope.daemon")

# Threads that may run bcrypt at once: a flood of wrong passwords queues here, away from
# the app's own thread pool, and a cached right password never waits for it.
BCRYPT_THREADS = 2
_ACCEPTED_CACHE = 64  # digests of credentials that passed, kept for the next request


@functools.cache
def dummy_hash() -> bytes:
    """Checked for an unknown user, so the response time does not tell which users exist;
    made on first use, so a daemon without basic auth never loads bcrypt."""
    import bcrypt

    return bcrypt.hashpw(b"rankscope: no such user", bcrypt.gensalt(rounds=10))


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


class BasicAuth:
    """Checks an Authorization header against the users. Credentials that passed are
    remembered by a digest, so a scraper pays for bcrypt once; failures are not, so a flood
    of wrong passwords cannot push a right one out."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = dict(users)
        self._accepted: dict[bytes, None] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def _credentials(self, authorization: bytes | None) -> tuple[bytes, bytes | None, bytes]:
        """(a digest of the user, their hash and the password; the hash, None for no such
        user; the password)."""
        user, password = parse_basic(authorization)
        hashed = self.users.get(user) if user is not None else None
        pw = (password or "").encode()
        key = hashlib.sha256(b"\0".join([(user or "").encode(), hashed or b"", pw])).digest()
        return key, hashed, pw

    def remembered(self, authorization: bytes | None) -> bool:
        """Whether these credentials passed before (no bcrypt)."""
        key, hashed, _ = self._credentials(authorization)
        with self._lock:
            return hashed is not None and key in self._accepted

    def check(self, authorization: bytes | None) -> bool:
        """bcrypt's verdict (slow by design: run it off the event loop)."""
        import bcrypt

        key, hashed, pw = self._credentials(authorization)
        try:
            matches = bcrypt.checkpw(pw, hashed if hashed is not None else dummy_hash())
        except ValueError:  # a malformed hash
            matches = False
        ok = matches and hashed is not None
        if ok:
            with self._lock:
                self._accepted[key] = None
                while len(self._accepted) > _ACCEPTED_CACHE:
                    del self._accepted[next(iter(self._accepted))]
        return ok


@dataclass(frozen=True)
class Served:
    """What one version of the web config asks of every answer."""

    config: WebConfig
    auth: BasicAuth
    headers: tuple[tuple[bytes, bytes], ...]

    @classmethod
    def of(cls, config: WebConfig) -> Served:
        # Names lower-cased, as every other header the daemon sends.
        try:
            headers = tuple(
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in config.headers.items()
            )
        except UnicodeEncodeError as exc:
            raise WebConfigError(f"a header is not Latin-1: {exc}") from None
        return cls(config, BasicAuth(config.users), headers)


class WebAuth:
    """Basic auth on every path and the configured headers on every answer, refusals
    included, from the web config at ``path``, read again when it changes."""

    def __init__(self, app: Any, path: Path, config: WebConfig) -> None:
        self.app = app
        self.path = path
        self._served = Served.of(config)
        self._mtime = stamp(path)
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(BCRYPT_THREADS)

    def current(self) -> Served:
        """The config in force: the file's if it changed and can be used, else the last."""
        mtime = stamp(self.path)
        with self._lock:
            if mtime == self._mtime:
                return self._served
            self._mtime = mtime
            self._served = _reloaded(self.path, self._served)
            return self._served

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        served = self.current()

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and served.headers:
                message = {**message, "headers": [*message.get("headers", ()), *served.headers]}
            await send(message)

        if served.auth.enabled and not await self._passes(served.auth, scope):
            challenge = ((b"www-authenticate", b'Basic realm="rankscope"'),)
            await plain(with_headers, 401, b"Unauthorized\n", challenge)
            return
        await self.app(scope, receive, with_headers)

    async def _passes(self, auth: BasicAuth, scope: dict[str, Any]) -> bool:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if auth.remembered(header):
            return True
        return await anyio.to_thread.run_sync(auth.check, header, limiter=self._limiter)


def _reloaded(path: Path, last: Served) -> Served:
    """The config now in the file, or ``last`` (logged) where the file cannot be used or
    would turn auth off."""
    try:
        served = Served.of(load_web_config(path))
    except WebConfigError as exc:
        log.error(
            "web config %s changed but cannot be used, keeping the last good one: %s", path, exc
        )
        return last
    if last.auth.enabled and not served.auth.enabled:
        log.error(
            "web config %s changed: it has no basic_auth_users now; basic auth stays on with "
            "the last good config (restart the daemon to serve without auth)",
            path,
        )
        return last
    if (served.config.tls is None) != (last.config.tls is None):
        turned = "off" if served.config.tls is None else "on"
        log.warning("web config %s turns TLS %s: that takes effect at restart", path, turned)
    log.info(
        "web config %s changed: %d user(s), %d header(s)",
        path,
        len(served.auth.users),
        len(served.headers),
    )
    return served


def with_web_config(app: Any, path: Path) -> tuple[WebAuth, WebConfig]:
    """``app`` behind the web config at ``path``, and that config; WebConfigError for a file
    that cannot be used."""
    config = load_web_config(path)
    return WebAuth(app, path, config), config
