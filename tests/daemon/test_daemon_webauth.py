"""The web config at run time (rankscope.daemon.webauth): bcrypt checks, what is remembered,
and the reload of the file while serving, in both directions, over loopback."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import bcrypt
import pytest
from tests.daemon.test_daemon_http import ServeApp, daemon_app
from tests.daemon.test_daemon_webconfig import ALICE_HASH, basic, make_self_signed

from rankscope.daemon import webauth
from rankscope.daemon.webauth import BasicAuth, WebAuth


def test_basic_auth_good_bad_and_unknown() -> None:
    auth = BasicAuth({"alice": ALICE_HASH.encode()})
    assert not auth.remembered(basic("alice", "wonderland"))
    assert auth.check(basic("alice", "wonderland"))
    assert auth.remembered(basic("alice", "wonderland"))  # no bcrypt the next time
    assert not auth.check(basic("alice", "looking-glass"))
    assert not auth.remembered(basic("alice", "looking-glass"))  # failures are not kept
    assert not auth.check(basic("mallory", "wonderland"))
    assert not auth.check(None)
    assert not auth.check(b"Bearer abc")
    assert not auth.check(b"Basic !!!not-base64")
    assert not auth.check(b"Basic " + __import__("base64").b64encode(b"no-colon"))


def test_an_unknown_user_costs_a_bcrypt_check_like_a_known_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refusal of an unknown user runs bcrypt against a dummy hash, so the response time does
    not tell which users exist."""
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def spy(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", spy)
    auth = BasicAuth({"alice": ALICE_HASH.encode()})
    assert not auth.check(basic("mallory", "x"))
    assert not auth.check(basic("alice", "x"))
    assert checked == [webauth.dummy_hash(), ALICE_HASH.encode()]


def rewrite(path: Path, text: str) -> None:
    """``text`` into ``path`` with a new modification time, as an editor's save gives."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def test_the_web_config_is_reloaded_in_both_directions_and_fails_closed(
    flight_dir: Path, tmp_path: Path, serve_app: ServeApp, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    app = WebAuth(daemon_app(flight_dir), cfg)
    client = serve_app(app)
    alice = {"Authorization": basic("alice", "wonderland").decode()}
    opened = client.get("/healthz")
    assert opened.status_code == 200 and opened.headers["x-frame-options"] == "deny"
    # Users added while serving turn auth on, headers changed take effect.
    rewrite(cfg, f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n")
    assert client.get("/healthz").status_code == 401
    answer = client.get("/healthz", headers=alice)
    assert answer.status_code == 200 and "x-frame-options" not in answer.headers
    with caplog.at_level(logging.INFO, logger="rankscope.daemon"):
        # A file that does not parse keeps the last good config, and says why.
        rewrite(cfg, "basic_auth_users: [\n")
        assert client.get("/healthz").status_code == 401
        assert client.get("/healthz", headers=alice).status_code == 200
        assert "cannot be used, keeping the last good one" in caplog.text
        # Auth, once on, is never turned off by the file: an emptied list is refused.
        caplog.clear()
        rewrite(cfg, "basic_auth_users: {}\n")
        assert client.get("/healthz").status_code == 401
        assert "basic auth stays on" in caplog.text
        cfg.unlink()
        assert client.get("/api/v1/boots").status_code == 401
        # A good file again is taken.
        bob = bcrypt.hashpw(b"builder", bcrypt.gensalt(rounds=4)).decode()
        rewrite(cfg, f"basic_auth_users:\n  bob: '{bob}'\n")
        assert client.get("/healthz", headers=alice).status_code == 401
        bob_auth = {"Authorization": basic("bob", "builder").decode()}
        assert client.get("/healthz", headers=bob_auth).status_code == 200
    assert "2 user(s)" not in caplog.text and "1 user(s), 0 header(s)" in caplog.text


def test_a_tls_file_that_cannot_be_read_keeps_the_last_good_config(
    flight_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = make_self_signed(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    app = WebAuth(daemon_app(flight_dir), cfg)
    served = app.current()
    # A regular file whose read fails (EIO): an OSError, as a file gone after the check is.
    rewrite(cfg, f"tls_server_config:\n  cert_file: /proc/self/mem\n  key_file: {key}\n")
    assert app.current() is served
    assert "cannot be used, keeping the last good one" in caplog.text
