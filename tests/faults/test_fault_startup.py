"""Faults at start-up and in the web config, against `rankscope serve` as a real process:
a taken port, a key that does not match its certificate, an expired certificate, and a live
edit that empties basic_auth_users."""

from __future__ import annotations

import datetime
import socket
import ssl
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from tests.daemon.test_daemon_serve import get, serve
from tests.daemon.test_daemon_webconfig import (
    ALICE_HASH,
    _certificate,
    _write_key_and_cert,
    https_get,
)

SERVE = [
    sys.executable,
    "-m",
    "rankscope",
    "serve",
    "--no-collector.cards",
    "--no-collector.holdings",
]


def run_serve(flight_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, f"--flight-dir={flight_dir}", *args], capture_output=True, text=True, timeout=60
    )


def test_a_taken_port_exits_2_with_one_line_and_never_says_it_serves(flight_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_serve(flight_dir, f"--web.listen-address=127.0.0.1:{port}")
    assert result.returncode == 2, result.stderr
    assert "serving on" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("rankscope serve: "), result.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0]


def test_a_key_not_matching_its_certificate_exits_1_naming_both_files(
    flight_dir: Path, tmp_path: Path
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert, _ = _write_key_and_cert(tmp_path, "server", key, _certificate("127.0.0.1", key))
    other = ec.generate_private_key(ec.SECP256R1())
    _, wrong_key = _write_key_and_cert(tmp_path, "other", other, _certificate("x", other))
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {wrong_key}\n")
    result = run_serve(flight_dir, f"--web.config.file={cfg}", "--web.listen-address=127.0.0.1:0")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankscope serve: TLS"), result.stderr
    assert str(cert) in lines[0] and str(wrong_key) in lines[0]


def test_an_expired_certificate_is_served_with_a_warning(flight_dir: Path, tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = ec.generate_private_key(ec.SECP256R1())
    fresh = _certificate("127.0.0.1", key)
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = (
        x509.CertificateBuilder()
        .subject_name(fresh.subject)
        .issuer_name(fresh.issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=10))
        .not_valid_after(now - datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert, _ = _write_key_and_cert(tmp_path, "server", key, expired)
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    log = tmp_path / "serve.log"
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    with serve(flight_dir, f"--web.config.file={cfg}", log=log) as url:
        status, _, body = https_get(url.replace("http://", "https://") + "/healthz", insecure)
        assert status == 200 and body == b"ok\n"
    text = log.read_text()
    assert "WARNING" in text and f"TLS certificate {cert} expired" in text, text


def test_a_live_edit_that_empties_basic_auth_users_keeps_auth_on(
    flight_dir: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n")
    log = tmp_path / "serve.log"
    with serve(flight_dir, f"--web.config.file={cfg}", log=log) as url:
        assert get(url + "/healthz")[0] == 401
        cfg.write_text("basic_auth_users: {}\n")
        assert get(url + "/healthz")[0] == 401  # fail closed: only a restart turns auth off
    errors = [line for line in log.read_text().splitlines() if " ERROR " in line]
    assert any("basic auth stays on" in e and str(cfg) in e for e in errors), errors
