"""exporter-toolkit as the oracle for the web config: each config of its web/testdata
(tests/fixtures/exporter_toolkit, with its NOTICE), and the cases its Go tests and code
define, run through rankscope with Go's outcome beside it.

Go's outcome is what exporter-toolkit's tls_config_test.go expects (its ErrorMap's words) or,
for cases its code defines without a test, what that code does (the comment names it). A case
where rankscope knowingly differs names the row of docs/daemon.md's table that says why, and
the only difference allowed is a refusal of a file Go would serve: rankscope never serves a
file Go refuses. Handshakes run against the TLS context rankscope would serve with; a sample
of configs is served by a real `rankscope serve`.
"""

from __future__ import annotations

import base64
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.daemon.test_daemon_serve import get
from tests.daemon.test_daemon_webconfig import https_get, serve_web_config

from rankscope.daemon.webconfig import WebConfig, WebConfigError, load_web_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exporter_toolkit"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "daemon.md"
OK = "ok"
TLS = 'tls_server_config:\n  cert_file: "server.crt"\n  key_file: "server.key"\n'
# Two users of web_config_users*.good.yml, with the passwords exporter-toolkit's tests use.
DAVE = ("dave", "dave123")
CAROL = ("carol", "carol123")


@dataclass(frozen=True)
class Client:
    """A client of Go's test (getTLSClient): trusts the server, may present one of the
    fixture's client certificates, and may limit its TLS version, ciphers and curve."""

    go: str  # OK, or the words of Go's error
    tls: bool = True
    cert: str | None = None
    max_tls11: bool = False
    min_tls13: bool = False
    ciphers: str | None = None  # OpenSSL names
    curve: str | None = None
    chosen: str | None = None  # the cipher Go's test expects the server to choose


@dataclass(frozen=True)
class Case:
    name: str
    config: str  # a fixture file name, or YAML (written next to the fixtures)
    go: str  # OK, or the words of Go's error when it loads the file
    difference: str | None = None  # docs/daemon.md's row, where rankscope refuses instead
    clients: tuple[Client, ...] = ()


def served(name: str, config: str, *clients: Client) -> Case:
    """A config Go serves, and what each client gets from it (one plain client unless named)."""
    return Case(name, config, OK, clients=clients or (Client(OK),))


def refused_here(name: str, config: str, row: str) -> Case:
    """A config Go serves that rankscope refuses, docs/daemon.md's ``row`` saying why."""
    return Case(name, config, OK, difference=row)


CASES = [
    # TestYAMLFiles: each is loaded (Go's run and validate agree on all of them).
    Case("path invalid", "somefile", "no such file"),
    Case("empty", "web_config_empty.yml", OK),
    Case("junk", "web_config_junk.yml", "yaml"),
    Case("junk key", "web_config_junk_key.yml", "yaml"),
    Case(
        "cert path empty",
        "web_config_noAuth_certPath_empty.bad.yml",
        "missing one of cert or cert_file",
    ),
    Case("cert empty", "web_config_noAuth_cert_empty.bad.yml", "missing one of cert or cert_file"),
    Case(
        "key path empty",
        "web_config_noAuth_keyPath_empty.bad.yml",
        "missing one of key or key_file",
    ),
    Case("key empty", "web_config_noAuth_key_empty.bad.yml", "missing one of key or key_file"),
    Case(
        "cert and key paths empty",
        "web_config_noAuth_certPath_keyPath_empty.bad.yml",
        "missing one of cert or cert_file",
    ),
    Case("cert path invalid", "web_config_noAuth_certPath_invalid.bad.yml", "no such file"),
    Case("key path invalid", "web_config_noAuth_keyPath_invalid.bad.yml", "no such file"),
    Case(
        "cert and key paths invalid",
        "web_config_noAuth_certPath_keyPath_invalid.bad.yml",
        "no such file",
    ),
    Case(
        "client CA without policy",
        "web_config_noAuth.bad.yml",
        "client CA's have been configured without a Client Auth Policy",
    ),
    Case("client CA file invalid", "web_config_auth_clientCAs_invalid.bad.yml", "no such file"),
    Case(
        "user list invalid",
        "web_config_auth_user_list_invalid.bad.yml",
        "hashedSecret too short to be a bcrypted password",
    ),
    Case("invented cipher", "web_config_noAuth_inventedCiphers.bad.yml", "unknown cipher"),
    Case("invented curve", "web_config_noAuth_inventedCurves.bad.yml", "unknown curve"),
    Case("wrong TLS version", "web_config_noAuth_wrongTLSVersion.bad.yml", "unknown TLS version"),
    # TestServerBehaviour.
    Case(
        "noAuth.good",
        "web_config_noAuth.good.yml",
        OK,
        clients=(
            Client("HTTP Request to HTTPS server", tls=False),
            Client(OK),
            Client("protocol version not supported", max_tls11=True),
            # Go checks a given certificate against the system's CAs: a self-signed one fails.
            Client("bad certificate", cert="client_selfsigned"),
        ),
    ),
    served("TLS inline", "web_config_noAuth_tlsInline.good.yml"),
    served("all ciphers", "web_config_noAuth_allCiphers.good.yml"),
    served(
        "some ciphers",
        "web_config_noAuth_someCiphers.good.yml",
        Client(OK, ciphers="ECDHE-RSA-AES128-GCM-SHA256"),
        Client("handshake failure", ciphers="ECDHE-RSA-AES256-SHA"),
        Client(
            OK,
            ciphers="ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384",
            chosen="ECDHE-RSA-AES128-GCM-SHA256",
        ),
    ),
    served(
        "some ciphers, client's order",
        "web_config_noAuth_someCiphers_noOrder.good.yml",
        Client(
            OK,
            ciphers="ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384",
            chosen="ECDHE-RSA-AES128-GCM-SHA256",
        ),
    ),
    served("all curves", "web_config_noAuth_allCurves.good.yml"),
    served(
        "some curves",
        "web_config_noAuth_someCurves.good.yml",
        Client(OK, curve="secp521r1"),
        Client("handshake failure", curve="secp384r1"),
    ),
    served("non-HTTP/2 ciphers, http2 off", "web_config_noAuth_noHTTP2.good.yml"),
    Case(
        "non-HTTP/2 ciphers, http2 on",
        "web_config_noAuth_noHTTP2Cipher.bad.yml",
        "TLSConfig.CipherSuites is missing an HTTP/2-required",
    ),
    Case("headers", "web_config_headers.good.yml", OK),
    Case(
        "X-Content-Type-Options: sniff",
        "web_config_headers_content_type_options.bad.yml",
        "invalid value for",
    ),
    Case("X-Frame-Options: foo", "web_config_headers_frame_options.bad.yml", "invalid value for"),
    Case("Content-Type header", "web_config_headers_extra_header.bad.yml", "can not be configured"),
    refused_here(
        "RequireAnyClientCert",
        "tls_config_noAuth.requireanyclientcert.good.yml",
        "RequireAnyClientCert",
    ),
    refused_here(
        "RequireAnyClientCert, inline key",
        "tls_config_noAuth.requireanyclientcertkeyinline.good.yml",
        "RequireAnyClientCert",
    ),
    served(
        "RequireAndVerifyClientCert",
        "tls_config_noAuth.requireandverifyclientcert.good.yml",
        Client(OK, cert="client_selfsigned"),
        Client("certificate required"),
    ),
    refused_here(
        "allowed SANs, good", "web_config_auth_client_san.good.yaml", "client_allowed_sans"
    ),
    refused_here("allowed SANs, bad", "web_config_auth_client_san.bad.yaml", "client_allowed_sans"),
    Case("rate limiter off", "web_config_rate_limiter_nonblocking.yaml", OK),
    refused_here("rate limiter 1s", "web_config_rate_limiter_one_second.yaml", "`rate_limit` on"),
    # TestConfigReloading's blocking file, and a testdata file no Go test loads.
    refused_here(
        "RequireAndVerifyClientCert, no CA",
        "web_config_noAuth.good.blocking.yml",
        "`RequireAndVerifyClientCert` without a CA",
    ),
    refused_here(
        "clientCAs missing",
        "web_config_auth_clientCAs_missing.bad.yml",
        "`RequireAndVerifyClientCert` without a CA",
    ),
    # TestUsers.
    Case("users, no TLS", "web_config_users_noTLS.good.yml", OK),
    served("users, TLS", "web_config_users.good.yml"),
    # Cases exporter-toolkit's code defines. yaml.v2's UnmarshalStrict refuses a repeated key.
    Case("second, empty tls_server_config", TLS + "tls_server_config:\n", "already set"),
    Case(
        "second, empty basic_auth_users",
        "basic_auth_users:\n  dave: $2y$10$2UXri9cIDdgeKjBo4Rlpx.U3ZLDV8X1IxKmsfOvhcM5oXQt/mLmXq\n"
        "basic_auth_users:\n",
        "already set",
    ),
    Case("a user twice", "basic_auth_users:\n  dave: x\n  dave: y\n", "already set in map"),
    # handler.go validateHeaderConfig: names and enumerated values matched exactly.
    Case(
        "header name in lower case",
        "http_server_config:\n  headers:\n    x-frame-options: deny\n",
        "can not be configured",
    ),
    Case(
        "X-Frame-Options: sameorigin",
        "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n",
        OK,
    ),
    Case(
        "X-Frame-Options: DENY",
        "http_server_config:\n  headers:\n    X-Frame-Options: DENY\n",
        "invalid value for",
    ),
    # net/http writes CR and LF in a header value as spaces.
    Case(
        "CR/LF in a header value",
        'http_server_config:\n  headers:\n    X-XSS-Protection: "1\\r\\nSet-Cookie: a=b"\n',
        OK,
    ),
    refused_here(
        "non-ASCII header value",
        'http_server_config:\n  headers:\n    Content-Security-Policy: "default-src é"\n',
        "header value with CR/LF",
    ),
    # HTTPConfig.HTTP2 is a bool: yaml.v2 takes YAML 1.1's plain booleans only.
    Case(
        "http2: maybe",
        "http_server_config:\n  http2: maybe\n",
        "cannot unmarshal !!str `maybe` into bool",
    ),
    Case(
        "http2: quoted true",
        "http_server_config:\n  http2: 'true'\n",
        "cannot unmarshal !!str `true` into bool",
    ),
    Case("http2: 1", "http_server_config:\n  http2: 1\n", "cannot unmarshal !!int `1` into bool"),
    Case("http2: y", "http_server_config:\n  http2: y\n", OK),
    Case("http2: off", "http_server_config:\n  http2: off\n", OK),
    # golang.org/x/crypto/bcrypt Cost(): shorter than 59 characters, a version above 2 or a
    # cost outside 4..31 is refused; other damage starts and refuses every password.
    Case(
        "bcrypt cut to 58",
        "basic_auth_users:\n  dave: $2y$10$2UXri9cIDdgeKjBo4Rlpx.U3ZLDV8X1IxKmsfOvhcM5oXQt/mLm\n",
        "hashedSecret too short",
    ),
    refused_here(
        "bcrypt cut to 59",
        "basic_auth_users:\n  dave: $2y$10$2UXri9cIDdgeKjBo4Rlpx.U3ZLDV8X1IxKmsfOvhcM5oXQt/mLmX\n",
        "`basic_auth_users` hash damaged",
    ),
    Case(
        "bcrypt cost 3",
        "basic_auth_users:\n  dave: $2y$03$2UXri9cIDdgeKjBo4Rlpx.U3ZLDV8X1IxKmsfOvhcM5oXQt/mLmXq\n",
        "cost 3 is outside allowed range",
    ),
    Case(
        "bcrypt version 3",
        "basic_auth_users:\n  dave: $3y$10$2UXri9cIDdgeKjBo4Rlpx.U3ZLDV8X1IxKmsfOvhcM5oXQt/mLmXq\n",
        "is newer than current version",
    ),
    Case("plain password", "basic_auth_users:\n  dave: dave123\n", "hashedSecret too short"),
    # tls_config.go ConfigToTLSConfig.
    served(
        "RequireClientCert with a CA",
        TLS + '  client_auth_type: RequireClientCert\n  client_ca_file: "client_selfsigned.pem"\n',
        Client(OK, cert="client_selfsigned"),
        Client("certificate required"),
    ),
    served(
        "RequestClientCert, no CA",
        TLS + "  client_auth_type: RequestClientCert\n",
        Client(OK),
        Client(OK, cert="client_selfsigned"),
    ),
    served(
        "VerifyClientCertIfGiven with a CA",
        TLS
        + '  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: "client_selfsigned.pem"\n',
        Client(OK),
        Client(OK, cert="client_selfsigned"),
        Client("unknown ca", cert="client2_selfsigned"),
    ),
    served(  # tls_config.go reads an inline client_ca as it reads client_ca_file
        "VerifyClientCertIfGiven with an inline CA",
        TLS
        + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca: |\n    "
        + "\n    ".join((FIXTURES / "client_selfsigned.pem").read_text().splitlines())
        + "\n",
        Client(OK),
        Client(OK, cert="client_selfsigned"),
        Client("unknown ca", cert="client2_selfsigned"),
    ),
    Case(
        "client CA file without policy",
        TLS + '  client_ca_file: "client_selfsigned.pem"\n',
        "client CA's have been configured without a Client Auth Policy",
    ),
    Case(
        "inline client CA without policy",
        TLS + "  client_ca: x\n",
        "client CA's have been configured without a Client Auth Policy",
    ),
    Case("invalid ClientAuth", TLS + "  client_auth_type: Sometimes\n", "invalid ClientAuth"),
    served("cert file and inline cert", TLS + "  cert: junk\n"),
    refused_here(
        "min above max",
        TLS + "  min_version: TLS13\n  max_version: TLS12\n",
        "`min_version` above `max_version`",
    ),
    refused_here(
        "TLS settings, no certificate",
        "tls_server_config:\n  min_version: TLS13\n",
        "`tls_server_config` with settings but no certificate",
    ),
    # crypto/tls: the version bounds, and TLS 1.3 suites that are not configurable.
    served(
        "max TLS12",
        TLS + "  max_version: TLS12\n",
        Client(OK),
        Client("protocol version not supported", min_tls13=True),
    ),
    Case(
        "TLS 1.3 suites only, http2 on",
        TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
        "TLSConfig.CipherSuites is missing an HTTP/2-required",
    ),
    Case(
        "TLS 1.3 suites only, null http_server_config",  # Go's zero value: http2 off
        TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\nhttp_server_config:\n",
        OK,
    ),
    served(
        "TLS 1.3 suites only",
        TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\nhttp_server_config:\n  http2: false\n",
        Client(OK),
        Client("handshake failure", ciphers="ECDHE-RSA-AES128-GCM-SHA256"),
    ),
    # x509.CertPool.AppendCertsFromPEM skips what is not a certificate: an empty pool.
    refused_here(
        "junk inline client CA",
        TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca: junk\n",
        "client CA with no usable certificate",
    ),
    served(
        "several curves",
        TLS + "  curve_preferences: [X25519, CurveP384]\n",
        Client(OK, curve="X25519"),
    ),
    Case(
        "YAML merge key",
        "base: &b\n  http2: true\nhttp_server_config:\n  <<: *b\n",
        "field base not found",
    ),
    refused_here(
        "merge key inside a section",
        "http_server_config:\n  <<: {http2: true}\n",
        "a YAML merge key",
    ),
    Case("rate_limit unknown key", "rate_limit:\n  every: 1s\n", "field every not found"),
    Case("rate_limit bad duration", "rate_limit:\n  interval: soon\n", "cannot unmarshal"),
    Case(
        "null sections",
        "tls_server_config:\nhttp_server_config:\nbasic_auth_users:\nrate_limit:\n",
        OK,
    ),
]

CASE_NAMED = {c.name: c for c in CASES}


def config_file(case: Case, directory: Path) -> Path:
    """The case's config in ``directory`` beside a copy of the fixtures: the fixture file, or
    the case's YAML written as inline.yml."""
    shutil.copytree(FIXTURES, directory, dirs_exist_ok=True)
    if "\n" not in case.config:
        return directory / case.config
    path = directory / "inline.yml"
    path.write_text(case.config)
    return path


def load(case: Case, directory: Path) -> WebConfig:
    """What `rankscope serve` does with the file before it serves: load it, and make the TLS
    context (WebConfigError or ssl.SSLError when it cannot)."""
    config = load_web_config(config_file(case, directory))
    if config.tls is not None:
        config.tls.context()
    return config


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_config_loads_or_fails_as_in_go(case: Case, tmp_path: Path) -> None:
    try:
        config: WebConfig | None = load(case, tmp_path)
        refusal = None
    except (WebConfigError, ssl.SSLError) as exc:
        config, refusal = None, str(exc)
    if case.difference is None:
        assert (refusal is None) == (case.go == OK), f"Go: {case.go}; rankscope: {refusal}"
    else:
        # The one kind of difference allowed: rankscope refuses a file Go serves, and says why.
        assert case.go == OK and refusal is not None, refusal
        assert case.difference in DOCS.read_text(), case.difference
    if config is not None and config.tls is not None:
        context = config.tls.context()
        for client in case.clients:
            served, detail = handshake(context, client)
            assert served == (client.go == OK), f"{client}: {detail}"
            if client.chosen is not None:
                assert detail == client.chosen


def test_the_oracle_covers_every_config_of_the_testdata() -> None:
    named = {c.config for c in CASES}
    assert {p.name for p in FIXTURES.glob("*.y*ml")} <= named


def test_what_go_serves_reads_as_go_reads_it(tmp_path: Path) -> None:
    headers = load(CASE_NAMED["headers"], tmp_path).headers
    assert headers["X-XSS-Protection"] == "1"
    assert headers["Content-Security-Policy"] == "default-src 'self' *.test.example.net"
    crlf = load(CASE_NAMED["CR/LF in a header value"], tmp_path).headers
    assert crlf == {"X-XSS-Protection": "1  Set-Cookie: a=b"}  # one header, as Go sends it
    assert load(CASE_NAMED["http2: y"], tmp_path).http2 is True
    assert load(CASE_NAMED["http2: off"], tmp_path).http2 is False
    users = load(CASE_NAMED["users, no TLS"], tmp_path).users
    assert set(users) == {"alice", "bob", "carol", "dave"}


def handshake(context: ssl.SSLContext, client: Client) -> tuple[bool, str]:
    """(served, the cipher chosen or why not) for one request from ``client`` to a server
    with ``context`` on loopback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        server = threading.Thread(target=_answer_one, args=(listener, context), daemon=True)
        server.start()
        try:
            return _request(listener.getsockname()[1], client)
        finally:
            server.join(timeout=10)


def _answer_one(listener: socket.socket, context: ssl.SSLContext) -> None:
    try:
        conn, _ = listener.accept()
        conn.settimeout(10)
        with context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1024)
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nHello World!")
    except (ssl.SSLError, OSError):
        return  # the client sees the refusal


def _request(port: int, client: Client) -> tuple[bool, str]:
    request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            if not client.tls:
                raw.sendall(request)
                answer = raw.recv(1024)
                return answer.endswith(b"Hello World!"), repr(answer[:40])
            with _client_context(client).wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(request)
                answer = tls.recv(1024)  # TLS 1.3 reports a refused certificate here
                cipher = (tls.cipher() or ("",))[0]
                return answer.endswith(b"Hello World!"), cipher
    except (ssl.SSLError, OSError) as exc:
        return False, str(exc)


def trusting_server_crt() -> ssl.SSLContext:
    """A client that trusts the fixture's server certificate. Go's test trusts
    tls-ca-chain.pem, but OpenSSL refuses that chain: its CA's extended key usage is "any",
    which OpenSSL does not count as server authentication. The certificate itself is the
    trust anchor here (a partial chain), with the host name still checked."""
    context = ssl.create_default_context(cafile=str(FIXTURES / "server.crt"))
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def _client_context(client: Client) -> ssl.SSLContext:
    context = trusting_server_crt()
    if client.cert is not None:
        context.load_cert_chain(
            str(FIXTURES / f"{client.cert}.pem"), str(FIXTURES / f"{client.cert}.key")
        )
    if client.max_tls11:
        with warnings.catch_warnings():  # an old client is the point of this one
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
            context.maximum_version = ssl.TLSVersion.TLSv1_1
    if client.min_tls13:
        context.minimum_version = ssl.TLSVersion.TLSv1_3
    if client.ciphers is not None:  # Go's client ciphers apply to TLS 1.2
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(client.ciphers)
    if client.curve is not None:
        context.set_ecdh_curve(client.curve)
    return context


# A real `rankscope serve` for a sample: TLS (file and inline), basic auth, headers.
SERVED = ["noAuth.good", "TLS inline", "users, no TLS", "headers"]


@pytest.mark.parametrize("name", SERVED)
def test_a_real_daemon_serves_a_sample_as_go_does(
    name: str, flight_dir: Path, tmp_path: Path
) -> None:
    case = CASE_NAMED[name]
    config = load(case, tmp_path / "web")
    cfg = tmp_path / "web" / case.config
    with serve_web_config(flight_dir, cfg, tmp_path / "serve.log") as url:
        if config.tls is not None:
            https = url.replace("http://", "https://").replace("127.0.0.1", "localhost")
            assert https_get(https + "/healthz", trusting_server_crt())[0] == 200
            with pytest.raises(OSError):  # Go: "HTTP Request to HTTPS server"
                get(url + "/healthz", timeout=5)
            return
        if config.users:
            assert get(url + "/healthz")[0] == 401  # Go: "Unauthorized"
            assert get(url + "/healthz", _basic(*DAVE))[0] == 200
            assert get(url + "/healthz", _basic(*CAROL))[0] == 200
            assert get(url + "/healthz", _basic("dave", "bad"))[0] == 401
            assert get(url + "/healthz", _basic("nonexistent", "nonexistent"))[0] == 401
            return
        status, headers, _ = get(url + "/healthz")
        assert status == 200
        sent = {name.lower(): value for name, value in headers.items()}
        assert len(config.headers) == 5
        for header, value in config.headers.items():
            assert sent[header.lower()] == value


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# The five files that were served with less protection than they ask for; Go refuses each.
# rankscope's words for each.
REFUSED_AT_START = {
    "client CA file without policy": "without a Client Auth Policy",
    "second, empty tls_server_config": "'tls_server_config' appears twice",
    "second, empty basic_auth_users": "'basic_auth_users' appears twice",
    "X-Frame-Options: foo": "invalid value for X-Frame-Options",
    "bcrypt cut to 58": "dave is not a bcrypt hash",
    "http2: maybe": "http2 must be true or false",
}


@pytest.mark.parametrize("name", list(REFUSED_AT_START))
def test_serve_refuses_to_start_on_what_go_refuses(
    name: str, flight_dir: Path, tmp_path: Path
) -> None:
    case = CASE_NAMED[name]
    assert case.go != OK
    path = config_file(case, tmp_path / "web")
    result = subprocess.run(
        [sys.executable, "-m", "rankscope", "serve", f"--flight-dir={flight_dir}",
         f"--web.config.file={path}", "--web.listen-address=127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert str(path) in result.stderr and REFUSED_AT_START[name] in result.stderr
    assert "Traceback" not in result.stderr
