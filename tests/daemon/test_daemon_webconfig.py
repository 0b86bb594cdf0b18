"""The exporter-toolkit web config: parsing, basic auth with bcrypt, and a real daemon
serving TLS with a self-signed certificate made here."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import ipaddress
import ssl
import tempfile
import urllib.error
import urllib.request
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from tests.daemon.test_daemon_serve import serve

from rankscope.daemon import webconfig
from rankscope.daemon.webconfig import (
    WebConfigError,
    go_duration,
    load_web_config,
    parse_web_config,
)

# Cost 4 keeps the tests quick; the daemon accepts any bcrypt cost.
ALICE_HASH = bcrypt.hashpw(b"wonderland", bcrypt.gensalt(rounds=4)).decode()


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def test_a_full_config_parses_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    text = f"""
tls_server_config:
  cert_file: tls/server.crt
  key_file: tls/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: tls/ca.crt
  min_version: TLS13
http_server_config:
  headers:
    X-Frame-Options: deny
basic_auth_users:
  alice: {ALICE_HASH}
"""
    config = parse_web_config(text, tmp_path)
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "tls/server.crt"
    assert config.tls.client_ca_file == tmp_path / "tls/ca.crt"
    assert config.tls.cert_reqs == ssl.CERT_REQUIRED
    assert config.headers == {"X-Frame-Options": "deny"}
    assert set(config.users) == {"alice"}
    assert parse_web_config("", tmp_path) == webconfig.WebConfig()


TLS = "tls_server_config:\n  cert_file: a\n  key_file: b\n"
HASH_LINE = f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basic_auth_user:\n  alice: x\n", "unknown key.*basic_auth_user"),
        ("basic_auth_users:\n  alice: plaintext\n", "alice is not a bcrypt hash"),
        # Cut by two characters Go refuses too ("hashedSecret too short"); by one, Go starts
        # and refuses every password of the user.
        (f"basic_auth_users:\n  alice: '{ALICE_HASH[:-2]}'\n", "58 characters where bcrypt has 60"),
        (f"basic_auth_users:\n  alice: '{ALICE_HASH[:-1]}'\n", "59 characters where bcrypt has 60"),
        (f"basic_auth_users:\n  alice: '{ALICE_HASH[:-1]}!'\n", "alice is not a bcrypt hash"),
        (f"basic_auth_users:\n  alice: '{ALICE_HASH.replace('$04$', '$03$')}'\n", "cost 03"),
        ("tls_server_config:\n  cert_file: a.crt\n", "missing one of key or key_file"),
        ("tls_server_config:\n  key_file: a.key\n", "missing one of cert or cert_file"),
        (TLS + "  min_version: SSL3\n", "unknown TLS version"),
        (TLS + "  min_version: TLS13\n  max_version: TLS12\n", "above max_version"),
        (TLS + "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        (TLS + "  client_auth_type: RequireAnyClientCert\n", "needs client_ca_file"),
        (TLS + "  client_auth_type: Sometimes\n", "invalid ClientAuth"),
        (TLS + "  client_ca_file: ca.crt\n", "client CA's have been configured without a Client"),
        (TLS + "  client_ca: x\n", "without a Client Auth Policy"),
        (TLS + "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", "unknown cipher"),
        (TLS + "  cipher_suites: TLS_AES_128_GCM_SHA256\n", "cipher_suites must be a list"),
        (TLS + "  curve_preferences: [CurveP257]\n", "unknown curve"),
        (
            TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_allowed_sans: [a]\n",
            "client_allowed_sans is not supported",
        ),
        (TLS + "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n", "HTTP/2-required"),
        ("tls_server_config:\n  min_version: TLS13\n", "no certificate"),
        (
            "http_server_config:\n  headers:\n    Set-Cookie: x\n",
            "Set-Cookie.*can not be configured",
        ),
        ("http_server_config:\n  headers:\n    x-frame-options: deny\n", "can not be configured"),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: foo\n",
            "invalid value for X-Frame-Options",
        ),
        ("http_server_config:\n  headers:\n    X-Frame-Options: DENY\n", "invalid value"),
        ("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n", "invalid value"),
        ('http_server_config:\n  headers:\n    X-XSS-Protection: "1\\u0000"\n', "printable ASCII"),
        ('http_server_config:\n  headers:\n    X-XSS-Protection: "1é"\n', "printable ASCII"),
        ("http_server_config:\n  http2: maybe\n", "http2 must be true or false"),
        ("http_server_config:\n  http2: 'true'\n", "http2 must be true or false"),
        ("http_server_config:\n  http2: 1\n", "http2 must be true or false"),
        ("rate_limit:\n  interval: soon\n", "not a duration"),
        ("rate_limit:\n  interval: 1m30s\n  burst: 5\n", "rate_limit is not supported"),
        ("rate_limit:\n  interval: 1500ms\n", "rate_limit is not supported"),
        ("rate_limit:\n  interval: 1000000000\n", "rate_limit is not supported"),  # ns, as Go
        ("rate_limit:\n  interval: 1\n  burst: many\n", "burst must be an integer"),
        ("tls_server_config: [1, 2]\n", "must be a mapping"),
        ("just words\n", "top level must be a mapping"),
        ("{{{", "not valid YAML"),
        # Duplicate keys: the second, empty one would turn TLS or auth off (yaml.v2's strict
        # parser refuses them).
        (TLS + "tls_server_config:\n", "'tls_server_config' appears twice"),
        (HASH_LINE + "basic_auth_users:\n", "'basic_auth_users' appears twice"),
        (HASH_LINE + "  alice: x\n", "'alice' appears twice in basic_auth_users"),
        ("tls_server_config:\n  cert_file: a\n  cert_file: b\n  key_file: c\n", "appears twice"),
    ],
)
def test_a_bad_config_is_refused_with_the_key_named(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(WebConfigError, match=message):
        parse_web_config(text, tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http_server_config:\n  http2: yes\n", {"http2": True}),
        ("http_server_config:\n  http2: n\n", {"http2": False}),  # YAML 1.1, as yaml.v2 reads
        ("http_server_config:\n  http2: Off\n", {"http2": False}),
        ("http_server_config:\n  http2:\n", {"http2": False}),  # null: Go's zero value
        ("http_server_config:\n", {"http2": False}),  # a null section: Go's zero value
        ("http_server_config:\n  headers: {}\n", {"http2": True}),
        ("", {"http2": True}),
        ("rate_limit:\n  interval: 0\n  burst: 3\n", {}),  # Go: off
        ("rate_limit:\n  interval: -1s\n", {}),  # Go: limits nothing
        # CR/LF are sent as spaces, as Go's net/http does; a folded scalar's final newline goes.
        (
            'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\r\\nSet-Cookie: x"\n',
            {"headers": {"Content-Security-Policy": "a  Set-Cookie: x"}},
        ),
        (
            "http_server_config:\n  headers:\n    Content-Security-Policy: >\n      default-src 'self'\n",
            {"headers": {"Content-Security-Policy": "default-src 'self'"}},
        ),
        (
            "http_server_config:\n  headers:\n    X-XSS-Protection: 1\n",
            {"headers": {"X-XSS-Protection": "1"}},
        ),
        ("basic_auth_users:\n", {"users": {}}),
        ("", {}),
    ],
)
def test_values_read_as_go_reads_them(tmp_path: Path, text: str, expected: dict[str, Any]) -> None:
    config = parse_web_config(text, tmp_path)
    for name, value in expected.items():
        assert getattr(config, name) == value


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1m30s", 90.0), ("1500ms", 1.5), (".5h", 1800.0), ("-2us", -2e-6), ("0", 0.0), ("1", None),
     ("1x", None), ("", None), ("s", None), ("1h 2m", None)],
)  # fmt: skip
def test_durations_read_as_go_parses_them(text: str, seconds: float | None) -> None:
    assert (
        go_duration(text) == pytest.approx(seconds)
        if seconds is not None
        else go_duration(text) is None
    )


def test_tls_options_map_onto_openssl(tmp_path: Path) -> None:
    text = TLS + (
        "  client_auth_type: RequireClientCert\n  client_ca_file: ca.pem\n"
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n"
        "  curve_preferences: [X25519, CurveP256]\n  prefer_server_cipher_suites: false\n"
        "  max_version: TLS12\n"
    )
    tls = parse_web_config(text, tmp_path).tls
    assert tls is not None
    assert tls.client_auth_type == "RequireAnyClientCert"  # Go's old name, kept as an alias
    assert tls.cert_reqs == ssl.CERT_REQUIRED
    assert tls.cipher_suites == ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256")
    assert tls.curve_preferences == ("X25519", "CurveP256")
    assert (tls.min_version, tls.max_version, tls.prefer_server_cipher_suites) == (
        "TLS12",
        "TLS12",
        False,
    )
    # RequestClientCert asks for nothing here: Go asks but never checks what it gets.
    request = parse_web_config(TLS + "  client_auth_type: RequestClientCert\n", tmp_path).tls
    assert request is not None and request.cert_reqs == ssl.CERT_NONE
    # Go's main test config: VerifyClientCertIfGiven with no CA.
    given = parse_web_config(TLS + "  client_auth_type: VerifyClientCertIfGiven\n", tmp_path).tls
    assert given is not None and given.cert_reqs == ssl.CERT_OPTIONAL


def test_inline_certificate_and_key_make_a_context_and_never_show_in_repr(tmp_path: Path) -> None:
    cert, key = make_self_signed(tmp_path)
    indent = "\n    "
    text = (
        "tls_server_config:\n  cert: |\n    " + indent.join(cert.read_text().splitlines())
        + "\n  key: |\n    " + indent.join(key.read_text().splitlines()) + "\n"
    )  # fmt: skip
    tls = parse_web_config(text, tmp_path).tls
    assert tls is not None and tls.cert_file is None and tls.key_file is None
    assert "PRIVATE KEY" not in repr(tls)
    temporary = Path(tempfile.gettempdir())
    before = set(temporary.glob("rankscope-tls-*"))
    assert isinstance(tls.context(), ssl.SSLContext)
    assert tls.expired(0.0) is None
    assert set(temporary.glob("rankscope-tls-*")) == before  # the key's copy is gone
    broken = dataclasses.replace(tls, key=tls.key.replace("A", "B") if tls.key else None)
    with pytest.raises(ssl.SSLError, match="with key the inline key") as refused:
        broken.context()
    assert "PRIVATE KEY" not in str(refused.value)


def test_missing_certificate_files_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n")
    with pytest.raises(WebConfigError, match=r"cert_file .*nope\.crt does not exist"):
        load_web_config(cfg)


def _write_key_and_cert(directory: Path, stem: str, key: Any, cert: Any) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _certificate(
    subject: str, key: Any, issuer: tuple[str, Any] | None = None, *, ca: bool = False
) -> Any:
    """A certificate for ``subject`` (self-signed unless an (issuer name, issuer key) is
    given), valid for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    issuer_name, issuer_key = issuer if issuer else (subject, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(name(issuer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(issuer_key, hashes.SHA256())
    )


def make_self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return _write_key_and_cert(directory, "server", key, _certificate("127.0.0.1", key))


def serve_web_config(flight_dir: Path, cfg: Path, log: Path) -> AbstractContextManager[str]:
    """A real `rankscope serve` of ``flight_dir`` under the web config ``cfg``, with no
    card or holdings collector (no device here); its base URL."""
    return serve(
        flight_dir,
        f"--web.config.file={cfg}",
        "--no-collector.cards",
        "--no-collector.holdings",
        log=log,
    )


def https_get(
    url: str, context: ssl.SSLContext, auth: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-cased names, body)."""
    req = urllib.request.Request(url, headers={"Authorization": auth.decode()} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, _lower(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, _lower(err.headers), err.read()


def _lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def test_a_daemon_serves_tls_and_basic_auth_from_its_web_config(
    flight_dir: Path, tmp_path: Path
) -> None:
    cert, _key = make_self_signed(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
        f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n"
    )
    context = ssl.create_default_context(cafile=str(cert))
    with serve_web_config(flight_dir, cfg, tmp_path / "serve.log") as url:
        https = url.replace("http://", "https://")
        status, headers, _ = https_get(https + "/metrics", context)
        assert status == 401 and headers["www-authenticate"].startswith("Basic")
        status, headers, body = https_get(https + "/metrics", context, basic("alice", "wonderland"))
        assert status == 200 and b"rankscope_up" in body
        assert headers["x-content-type-options"] == "nosniff"
        assert https_get(https + "/metrics", context, basic("alice", "looking-glass"))[0] == 401
        assert https_get(https + "/healthz", context, basic("mallory", "wonderland"))[0] == 401
        # Plain HTTP to the TLS port gets no answer.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url + "/healthz", timeout=5)
        # A user added to the file works without a restart.
        bob = bcrypt.hashpw(b"builder", bcrypt.gensalt(rounds=4)).decode()
        cfg.write_text(cfg.read_text() + f"  bob: '{bob}'\n")
        assert https_get(https + "/healthz", context, basic("bob", "builder"))[0] == 200


def test_serve_refuses_a_web_config_it_cannot_use(flight_dir: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "web.yml"
    cfg.write_text("basic_auth_users:\n  alice: hunter2\n")
    result = subprocess.run(
        [sys.executable, "-m", "rankscope", "serve", f"--flight-dir={flight_dir}", f"--web.config.file={cfg}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "alice is not a bcrypt hash" in result.stderr


def test_client_certificates_and_the_minimum_tls_version_are_enforced(
    flight_dir: Path, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    server_cert, _ = make_self_signed(tmp_path)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    _write_key_and_cert(tmp_path, "ca", ca_key, _certificate("test CA", ca_key, ca=True))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert, client_key_path = _write_key_and_cert(
        tmp_path, "client", client_key, _certificate("prometheus", client_key, ("test CA", ca_key))
    )
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        "  min_version: TLS13\n"
    )
    with serve_web_config(flight_dir, cfg, tmp_path / "serve.log") as url:
        https = url.replace("http://", "https://") + "/healthz"
        with_cert = ssl.create_default_context(cafile=str(server_cert))
        with_cert.load_cert_chain(str(client_cert), str(client_key_path))
        assert https_get(https, with_cert)[0] == 200
        without_cert = ssl.create_default_context(cafile=str(server_cert))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            https_get(https, without_cert)
        old_tls = ssl.create_default_context(cafile=str(server_cert))
        old_tls.load_cert_chain(str(client_cert), str(client_key_path))
        old_tls.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            https_get(https, old_tls)


def served_certificate(port: int) -> bytes:
    """The DER certificate a new connection to ``port`` is served."""
    import socket

    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        insecure.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _rotate(directory: Path, stem: str, subject: str) -> bytes:
    """A new key and certificate written over ``stem``.crt/.key as a rotation does (each
    renamed into place); the certificate's DER."""
    from cryptography.hazmat.primitives.asymmetric import ec

    staged = directory / "staged"
    staged.mkdir(exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert, key_path = _write_key_and_cert(staged, stem, key, _certificate(subject, key))
    key_path.replace(directory / f"{stem}.key")
    cert.replace(directory / f"{stem}.crt")
    return ssl.PEM_cert_to_DER_cert((directory / f"{stem}.crt").read_text())


def test_a_rotated_certificate_and_a_new_client_policy_serve_new_connections_without_restart(
    flight_dir: Path, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    first = _rotate(tmp_path, "server", "first")
    cfg = tmp_path / "web.yml"
    tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    cfg.write_text(tls)
    log = tmp_path / "serve.log"
    with serve(flight_dir, f"--web.config.file={cfg}", "--no-collector.cards", log=log) as url:
        port = int(url.rsplit(":", 1)[1])
        assert served_certificate(port) == first
        second = _rotate(tmp_path, "server", "second")
        assert served_certificate(port) == second
        # A key that does not match its certificate keeps the last good pair.
        other = ec.generate_private_key(ec.SECP256R1())
        _write_key_and_cert(tmp_path / "staged", "other", other, _certificate("x", other))
        (tmp_path / "staged/other.key").replace(tmp_path / "server.key")
        assert served_certificate(port) == second
        assert "changed but cannot be used, keeping the last good one" in log.read_text()
        third = _rotate(tmp_path, "server", "third")
        assert served_certificate(port) == third
        # Client certificates required from now on.
        ca_key = ec.generate_private_key(ec.SECP256R1())
        _write_key_and_cert(tmp_path, "ca", ca_key, _certificate("test CA", ca_key, ca=True))
        client_key = ec.generate_private_key(ec.SECP256R1())
        client_cert, client_key_path = _write_key_and_cert(
            tmp_path, "client", client_key, _certificate("scraper", client_key, ("test CA", ca_key))
        )
        cfg.write_text(
            tls + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        )
        https = url.replace("http://", "https://") + "/healthz"
        without_cert = ssl.create_default_context(cafile=str(tmp_path / "server.crt"))
        without_cert.check_hostname = False
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            https_get(https, without_cert)
        with_cert = ssl.create_default_context(cafile=str(tmp_path / "server.crt"))
        with_cert.check_hostname = False
        with_cert.load_cert_chain(str(client_cert), str(client_key_path))
        assert https_get(https, with_cert)[0] == 200
        # TLS turned off in the file: still served over TLS, the restart it needs logged.
        cfg.write_text("")
        assert https_get(https, with_cert)[0] == 200
        assert "turns TLS off: that takes effect at restart" in log.read_text()
