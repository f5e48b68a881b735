"""The guard's rules without a socket (Host names, origins, the failure window on a fake
clock), and the token file: 0600, created once, rotated, refused when another user could read
it; ``maple-acp http-token`` prints and rotates it."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from maple_acp.cli import cli
from maple_acp.net import (
    GuardPolicy,
    HttpSetupError,
    RequestGuard,
    TokenFile,
    read_or_create_token,
    rotate_token,
    token_path,
)
from maple_acp.net._guard import (
    Refusal,
    TokenUnavailable,
    bearer_from_header,
    chosen_subprotocol,
    host_name,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_host_names_lose_their_port_and_case() -> None:
    assert host_name("LocalHost:8765") == "localhost"
    assert host_name("[::1]:8765") == "::1"
    assert host_name("[::1]") == "::1"
    assert host_name("[::1]:") == "::1"
    assert host_name("[0:0:0:0:0:0:0:1]:8765") == "::1"
    assert host_name("acp.example.") == "acp.example"
    assert host_name("acp.example:") == "acp.example"
    assert host_name("::1") == "::1"


@pytest.mark.parametrize(
    "header",
    [
        "[::1]evil.example",
        "[::1]@evil.example",
        "[::1].evil.example:8765",
        "[::1]:8765evil",
        "[::1]:80:80",
        "[::1",
        "[127.0.0.1]",
        "[127.0.0.1]:8765",
        "[localhost]",
        "[]",
        "localhost:http",
        "localhost:8765@evil.example",
        "",
        ":8765",
    ],
)
def test_a_host_header_with_anything_after_its_name_and_port_names_nothing(header: str) -> None:
    assert host_name(header) is None
    guard = RequestGuard(GuardPolicy.for_bind("::1"), lambda token: token == "t", FakeClock())
    assert guard.check_host(header) == Refusal(
        421, "a Host header that does not name this listener"
    )


def test_a_loopback_bind_admits_its_loopback_names_only() -> None:
    policy = GuardPolicy.for_bind("127.0.0.1", hosts=("acp.example",))
    assert policy.allowed_hosts == {"127.0.0.1", "::1", "localhost", "acp.example"}
    guard = RequestGuard(policy, lambda token: token == "t", FakeClock())
    assert guard.check_host("127.0.0.1:1") is None
    assert guard.check_host(None) is not None
    assert guard.check_host("attacker.example:8765") is not None


def test_failures_are_counted_per_address_in_a_one_second_window() -> None:
    clock = FakeClock()
    guard = RequestGuard(GuardPolicy.for_bind("127.0.0.1"), lambda token: token == "t", clock)
    for _ in range(10):
        refusal = guard.check_token("10.0.0.1", "wrong")
        assert refusal is not None
        assert refusal.status == 401
    for token in ("wrong", None):
        throttled = guard.check_token("10.0.0.1", token)
        assert throttled is not None
        assert throttled.status == 429
    # Another address is not affected.
    assert guard.check_token("10.0.0.2", "wrong") == Refusal(401, "a missing or wrong bearer token")
    # A throttled address keeps failing while its flood goes on...
    clock.now += 0.9
    assert guard.check_token("10.0.0.1", "wrong") == Refusal(
        429, "too many failed authentications from one address"
    )
    # ...and gets a 401 again a second after it stopped.
    clock.now += 1.01
    assert guard.check_token("10.0.0.1", "wrong") == Refusal(401, "a missing or wrong bearer token")


def test_the_right_token_is_admitted_from_a_throttled_address() -> None:
    clock = FakeClock()
    guard = RequestGuard(GuardPolicy.for_bind("127.0.0.1"), lambda token: token == "t", clock)
    for _ in range(100):
        clock.now += 0.001
        assert guard.check_token("127.0.0.1", "wrong") is not None
    assert guard.check_token("127.0.0.1", "wrong") == Refusal(
        429, "too many failed authentications from one address"
    )
    for _ in range(20):
        assert guard.check_token("127.0.0.1", "t") is None
        assert guard.check_token("127.0.0.1", "wrong") is not None
    assert guard.admit(address="127.0.0.1", host="127.0.0.1:1", origin=None, token="t") is None


def test_an_untrusted_token_file_admits_nobody_and_counts_as_a_failure() -> None:
    def unavailable(token: str) -> bool:
        raise TokenUnavailable("the token file is readable by others")

    guard = RequestGuard(GuardPolicy.for_bind("127.0.0.1"), unavailable, FakeClock())
    for _ in range(10):
        assert guard.check_token("127.0.0.1", "t") == Refusal(
            503, "the host's token file cannot be trusted now"
        )
    refused = guard.check_token("127.0.0.1", "t")
    assert refused is not None
    assert refused.status == 429


def test_bearer_parsing_and_the_subprotocol_answer() -> None:
    assert bearer_from_header("Bearer abc") == "abc"
    assert bearer_from_header("bearer  abc ") == "abc"
    assert bearer_from_header("Basic abc") is None
    assert bearer_from_header("Bearer ") is None
    assert chosen_subprotocol(["acp.bearer.x", "acp"]) == "acp"
    assert chosen_subprotocol(["acp.bearer.x"]) == "acp.bearer.x"
    assert chosen_subprotocol([]) is None


def test_the_token_file_is_private_made_once_and_rotated(tmp_path: Path) -> None:
    token = read_or_create_token(tmp_path)
    path = token_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) == 43  # 32 bytes, URL-safe base64 without padding
    assert read_or_create_token(tmp_path) == token
    watcher = TokenFile(tmp_path)
    assert watcher.matches(token)
    assert not watcher.matches(token[:-1])
    rotated = rotate_token(tmp_path)
    assert rotated != token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # A running listener takes the new token at once.
    assert watcher.matches(rotated)
    assert not watcher.matches(token)


def test_a_token_file_others_can_read_is_refused_without_the_token(tmp_path: Path) -> None:
    token = read_or_create_token(tmp_path)
    os.chmod(token_path(tmp_path), 0o644)
    with pytest.raises(HttpSetupError) as refused:
        read_or_create_token(tmp_path)
    assert "0600" in str(refused.value)
    assert token not in str(refused.value)


def test_the_http_token_command_prints_and_rotates(tmp_path: Path) -> None:
    runner = CliRunner()
    data = tmp_path / "data"
    first = runner.invoke(cli, ["http-token", "--data-dir", str(data)])
    assert first.exit_code == 0, first.output
    # stdout holds the token alone; stderr says that it was created, and where.
    token = first.stdout.strip()
    assert token == read_or_create_token(data)
    again = runner.invoke(cli, ["http-token", "--data-dir", str(data)])
    assert again.stdout.strip() == token
    rotated = runner.invoke(cli, ["http-token", "--data-dir", str(data), "--rotate"])
    assert rotated.exit_code == 0
    assert rotated.stdout.strip() not in ("", token)


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("0.0.0.0:8765", "without TLS"),
        ("192.0.2.1:8765", "without TLS"),
        ("localhost", "HOST:PORT"),
        ("example.com:8765", "IP address or localhost"),
    ],
)
def test_serve_refuses_a_bad_listener_in_one_line(tmp_path: Path, listen: str, says: str) -> None:
    runner = CliRunner()
    done = runner.invoke(
        cli,
        ["serve", "--http", listen, "--socket", str(tmp_path / "run" / "s.sock"),
         "--data-dir", str(tmp_path / "data")],
    )  # fmt: skip
    assert done.exit_code == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("maple-acp: ")
    assert says in lines[0]
    # Refused before anything started: no store, no token.
    assert not (tmp_path / "data" / "tasks.sqlite3").exists()


def test_the_http_table_of_the_config_file(tmp_path: Path) -> None:
    from maple_acp.config import ConfigFileError, parse_config, resolve_serve_settings

    path = tmp_path / "config.toml"
    config = parse_config(
        '[http]\nlisten = "127.0.0.1:8765"\nallowed_origins = ["https://ide.example"]\n'
        'tls_cert = "/etc/c.pem"\ntls_key = "/etc/k.pem"\n',
        path,
    )
    settings = resolve_serve_settings({}, {}, config)
    assert settings.http_listen == "127.0.0.1:8765"
    assert settings.http_allowed_origins == ("https://ide.example",)
    assert (settings.http_tls_cert, settings.http_tls_key) == ("/etc/c.pem", "/etc/k.pem")
    # The flag wins over the file.
    assert resolve_serve_settings({"http_listen": "[::1]:9"}, {}, config).http_listen == "[::1]:9"
    for text, key in (
        ("[http]\nlisten = 8765\n", "http.listen"),
        ("[http]\nport = 1\n", "http.port"),
        ('http = "127.0.0.1:1"\n', "http"),
        ('[http]\nallowed_origins = "https://one.example"\n', "http.allowed_origins"),
    ):
        with pytest.raises(ConfigFileError) as refused:
            parse_config(text, path)
        assert refused.value.key == key
        assert "\n" not in str(refused.value)


def test_a_token_file_made_readable_at_run_time_admits_nobody_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.net")
    token = read_or_create_token(tmp_path)
    path = token_path(tmp_path)
    watcher = TokenFile(tmp_path)
    assert watcher.matches(token)
    first = watcher.generation
    # A touch changes nothing that matters: same token, same generation, no log line.
    os.utime(path)
    assert watcher.matches(token)
    assert watcher.generation == first
    os.chmod(path, 0o644)  # mode only: inode, mtime and size are unchanged
    for _ in range(50):
        with pytest.raises(TokenUnavailable):
            watcher.matches(token)
    assert watcher.generation != first
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1
    assert "0600" in warned[0].getMessage()
    os.chmod(path, 0o600)
    assert watcher.matches(token)
    assert "usable again" in caplog.text
    assert token not in caplog.text


def test_a_vanished_token_file_admits_nobody_until_one_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.net")
    token = read_or_create_token(tmp_path)
    watcher = TokenFile(tmp_path)
    first = watcher.generation
    token_path(tmp_path).unlink()
    for _ in range(10):
        with pytest.raises(TokenUnavailable):
            watcher.matches(token)
    # Not made again behind the owner's back: that is for `maple-acp http-token`.
    assert not token_path(tmp_path).exists()
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    made = read_or_create_token(tmp_path)
    assert watcher.matches(made)
    assert not watcher.matches(token)
    assert watcher.generation != first


def test_the_generation_changes_with_the_token_in_force_only(tmp_path: Path) -> None:
    read_or_create_token(tmp_path)
    watcher = TokenFile(tmp_path)
    seen = {watcher.generation}
    for _ in range(3):
        rotate_token(tmp_path)
        watcher.refresh()
        assert watcher.generation not in seen
        seen.add(watcher.generation)
        watcher.refresh()
        assert watcher.generation in seen
