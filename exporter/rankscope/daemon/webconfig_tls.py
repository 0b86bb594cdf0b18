"""The web config's `tls_server_config` and the server's TLS context made from it. Go's
names map onto OpenSSL's; where Python's ssl module cannot do what Go does, the config is
refused with the reason (webconfig.py), never served with less protection (docs/daemon.md
lists each difference)."""

from __future__ import annotations

import contextlib
import logging
import ssl
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("rankscope.daemon")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's crypto/tls CipherSuites() (the ones without known weaknesses), by OpenSSL's name.
# TLS 1.3 suites are None: Go does not let them be configured either.
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# Go's net/http refuses to serve HTTP/2 over TLS 1.2 without one of these.
HTTP2_REQUIRED_CIPHERS = (
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
)
CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
# Go's client_auth_type -> what the ssl module does. Python cannot ask for a certificate
# without verifying it, so RequestClientCert does not ask (Go never checks the certificate
# it asks for either) and RequireAnyClientCert verifies against client_ca_file.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


@dataclass(frozen=True)
class TLSConfig:
    """A certificate and key each come from a file or inline PEM (the file wins, as in Go)."""

    cert_file: Path | None = None
    key_file: Path | None = None
    cert: str | None = field(default=None, repr=False)
    key: str | None = field(default=None, repr=False)
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    client_ca: str | None = field(default=None, repr=False)
    cipher_suites: tuple[str, ...] = ()  # Go's names, in the server's order of preference
    curve_preferences: tuple[str, ...] = ()  # Go's names
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True

    @property
    def cert_reqs(self) -> int:
        return int(CLIENT_AUTH[self.client_auth_type])

    @property
    def files(self) -> dict[str, Path]:
        keys = ("cert_file", "key_file", "client_ca_file")
        return {key: path for key in keys if (path := getattr(self, key)) is not None}

    def expired(self, now: float) -> str | None:
        """When the certificate's validity ended, if it has (served all the same, with a
        warning: refusing would turn an expiry into an outage of the metrics)."""
        try:
            with _pem_path(self.cert_file, self.cert) as cert:
                # The stdlib's only certificate decoder without a handshake.
                not_after = ssl._ssl._test_decode_cert(cert)["notAfter"]  # type: ignore[attr-defined]
        except (OSError, ValueError, KeyError, AttributeError):
            return None
        return not_after if ssl.cert_time_to_seconds(not_after) < now else None

    def context(self) -> ssl.SSLContext:
        """The server's TLS context; ssl.SSLError when the files cannot serve together."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            with (
                _pem_path(self.cert_file, self.cert) as cert,
                _pem_path(self.key_file, self.key) as key,
            ):
                context.load_cert_chain(cert, key)
        except ssl.SSLError as exc:  # named by file, never by the inline PEM
            cert_at = self.cert_file or "the inline cert"
            key_at = self.key_file or "the inline key"
            raise ssl.SSLError(
                f"cannot use certificate {cert_at} with key {key_at}: {exc.reason or exc}"
            ) from exc
        if expired := self.expired(time.time()):
            log.warning(
                "TLS certificate %s expired on %s; serving it anyway, clients will refuse it",
                self.cert_file or "(inline)",
                expired,
            )
        with warnings.catch_warnings():  # TLS10/TLS11 are deprecated, but the file asks
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = TLS_VERSIONS[self.min_version]
            context.maximum_version = TLS_VERSIONS[self.max_version]
        if self.cert_reqs != ssl.CERT_NONE and (self.client_ca_file or self.client_ca is not None):
            ca = f"client_ca_file {self.client_ca_file}" if self.client_ca_file else "client_ca"
            try:
                with _pem_path(self.client_ca_file, self.client_ca) as ca_pem:
                    context.load_verify_locations(cafile=ca_pem)
            except ssl.SSLError as exc:
                reason = exc.reason or exc
                raise ssl.SSLError(f"{ca} holds no usable CA certificate: {reason}") from exc
        context.verify_mode = ssl.VerifyMode(self.cert_reqs)
        if self.cipher_suites:
            openssl = [tls12 for name in self.cipher_suites if (tls12 := CIPHER_SUITES[name])]
            if openssl:
                context.set_ciphers(":".join(openssl))
            else:  # only TLS 1.3 suites listed: Go then has no TLS 1.2 suite either
                context.minimum_version = ssl.TLSVersion.TLSv1_3
        if not self.prefer_server_cipher_suites:  # the ssl module's server contexts prefer
            context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        if self.curve_preferences:
            # The ssl module sets one group: the most preferred (docs/daemon.md).
            context.set_ecdh_curve(CURVES[self.curve_preferences[0]])
        return context


class LiveContext(ssl.SSLContext):
    """A server context that wraps each new connection with the context ``current()``
    returns: exporter-toolkit reads its TLS config at each handshake (GetConfigForClient)."""

    def __new__(cls, *_args: object) -> LiveContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_SERVER)

    def __init__(self, current: Callable[[], ssl.SSLContext]) -> None:
        self._current = current

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        # asyncio wraps each accepted connection here, before its handshake starts.
        return self._current().wrap_bio(*args, **kwargs)


@contextlib.contextmanager
def _pem_path(path: Path | None, inline: str | None) -> Iterator[str]:
    """A path to read PEM from: the file, or the inline PEM in a private temporary directory
    while OpenSSL reads it (the ssl module loads certificates and keys from files only)."""
    if path is not None:
        yield str(path)
        return
    with tempfile.TemporaryDirectory(prefix="rankscope-tls-") as private:
        written = Path(private) / "inline.pem"
        written.touch(mode=0o600)
        written.write_text(inline or "")
        yield str(written)
