"""The web config at run time (--web.config.file, docs/daemon.md): basic auth with bcrypt and
the configured response headers as an ASGI layer, and the TLS context. The file is read again
when it or a TLS file it names changes; one that cannot be used keeps the last good config.
Users added turn auth on, and once it is on no route is served without it."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import ssl
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
from starlette.responses import PlainTextResponse
from starlette.types import Message, Receive, Scope, Send

from rankscope.daemon.webconfig import WebConfig, WebConfigError, load_web_config
from rankscope.daemon.webconfig_tls import LiveContext

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
    scheme, _, token = (authorization or b"").partition(b" ")
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep and scheme.lower() == b"basic" else (None, None)


class BasicAuth:
    """Checks an Authorization header against the users. Credentials that passed are
    remembered by a digest, so a scraper pays for bcrypt once; failures are not, so a flood
    of wrong passwords cannot push a right one out."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = dict(users)
        self._accepted: dict[bytes, None] = {}
        self._lock = threading.Lock()

    def _credentials(self, authorization: bytes | None) -> tuple[bytes, bytes | None, bytes]:
        """(A digest of user, hash and password; the user's hash, None if none; the password)."""
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
    """What one version of the web config asks of every answer and every new connection."""

    config: WebConfig
    auth: BasicAuth
    headers: tuple[tuple[bytes, bytes], ...]
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, config: WebConfig) -> Served:
        """ssl.SSLError for TLS files that cannot serve."""
        # Names lower-cased, as every other header the daemon sends; names and values are
        # printable ASCII (webconfig checks them).
        headers = tuple((k.lower().encode(), v.encode()) for k, v in config.headers.items())
        tls = config.tls.context() if config.tls is not None else None
        return cls(config, BasicAuth(config.users), headers, tls)

    def stamps(self, path: Path) -> tuple[tuple[int, int, int] | None, ...]:
        """When the web config and each TLS file it names last changed (None: unreadable)."""
        files = self.config.tls.files.values() if self.config.tls is not None else ()
        return tuple(_stamp(f) for f in (path, *files))


class WebAuth:
    """Basic auth on every path and the configured headers on every answer, refusals included,
    from the web config at ``path``, read again when it or a TLS file it names changes."""

    def __init__(self, app: Any, path: Path) -> None:
        """WebConfigError for a file that cannot be used, ssl.SSLError for TLS that cannot serve."""
        self.app = app
        self.path = path
        self._served = Served.of(load_web_config(path))
        self._stamps = self._served.stamps(path)
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(BCRYPT_THREADS)

    def current(self) -> Served:
        """The config in force: the file's if it changed and can be used, else the last."""
        stamps = self._served.stamps(self.path)
        with self._lock:
            if stamps != self._stamps:
                last = self._served
                self._served = _reloaded(self.path, last)
                # Stamps of the files read; those of files the config names anew, as of now.
                same = self._served.config.tls == last.config.tls
                self._stamps = stamps if same else self._served.stamps(self.path)
            return self._served

    def tls_context(self) -> ssl.SSLContext | None:
        """A context serving each new connection with the TLS settings and files in force,
        as exporter-toolkit reads them at each handshake; None without TLS."""
        first = self._served.tls
        return None if first is None else LiveContext(lambda: self.current().tls or first)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        served = self.current()

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and served.headers:
                message = {**message, "headers": [*message.get("headers", ()), *served.headers]}
            await send(message)

        if served.auth.users and not await self._passes(served.auth, scope):
            challenge = {"WWW-Authenticate": 'Basic realm="rankscope"'}
            await PlainTextResponse("Unauthorized\n", 401, challenge)(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)

    async def _passes(self, auth: BasicAuth, scope: Scope) -> bool:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if auth.remembered(header):
            return True
        return await anyio.to_thread.run_sync(auth.check, header, limiter=self._limiter)


def _reloaded(path: Path, last: Served) -> Served:
    """The config now in the file, or ``last`` (logged) where the file cannot be used or
    would turn auth off. TLS stays on or off as it started."""
    try:
        config = load_web_config(path)
        if (config.tls is None) != (last.config.tls is None):
            turned = "off" if config.tls is None else "on"
            log.warning("web config %s turns TLS %s: that takes effect at restart", path, turned)
            config = replace(config, tls=last.config.tls)
        served = Served.of(config)
    except (WebConfigError, OSError) as exc:  # ssl.SSLError, or a TLS file gone since the check
        log.error(
            "web config %s changed but cannot be used, keeping the last good one: %s", path, exc
        )
        return last
    if last.auth.users and not served.auth.users:
        log.error(
            "web config %s changed: it has no basic_auth_users now; basic auth stays on with "
            "the last good config (restart the daemon to serve without auth)",
            path,
        )
        return last
    users, headers = len(served.auth.users), len(served.headers)
    log.info("web config %s changed: %d user(s), %d header(s)", path, users, headers)
    return served


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """When a file last changed, with its size and inode, so a rewrite within one tick of a
    coarse clock or a file renamed over it (a Kubernetes secret's update) still shows."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino
