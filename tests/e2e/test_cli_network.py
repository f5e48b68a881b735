"""The network listener's commands as a new user meets them, in real subprocesses: the token
file `serve` reads is the one `http-token` prints and `status` names; a token made elsewhere
is never silent; a TLS key others can read stops `serve` in one line; the help says what a
HOST may be; the install hint works from a checkout too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from maple_acp.net import INSTALL_HINT, HttpSetupError, NetworkSettings

from .host_processes import MAPLE_ACP, clean_env, home_env, run_command, running_host


def maple_acp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_command([*MAPLE_ACP, *args], env=env)


async def test_http_token_and_status_name_the_token_file_the_host_reads(short_dir: Path) -> None:
    socket = os.fspath(short_dir / "run" / "acp.sock")
    served = short_dir / "data" / "http-token"
    async with running_host(short_dir, "--http", "127.0.0.1:0"):
        shown = await _in_thread(maple_acp, "status", "--socket", socket)
        assert shown.returncode == 0, shown.stderr
        assert f"  token file:   {served}" in shown.stdout.splitlines()
        report = json.loads(
            (await _in_thread(maple_acp, "status", "--json", "--socket", socket)).stdout
        )
        assert report["engine"]["httpTokenFile"] == os.fspath(served)

        # Another data directory than serve's: refused, naming both files; nothing is made.
        other = short_dir / "other"
        wrong = await _in_thread(
            maple_acp, "http-token", "--socket", socket, "--data-dir", os.fspath(other)
        )
        assert wrong.returncode == 1
        assert wrong.stdout == ""
        assert len(wrong.stderr.strip().splitlines()) == 1
        assert os.fspath(served) in wrong.stderr
        assert os.fspath(other / "http-token") in wrong.stderr
        assert "--data-dir" in wrong.stderr
        assert not (other / "http-token").exists()

        # serve's own: the token in the file it reads, and nothing said about creating one.
        right = await _in_thread(
            maple_acp, "http-token", "--socket", socket, "--data-dir", os.fspath(short_dir / "data")
        )
        assert right.returncode == 0, right.stderr
        assert right.stdout.strip() == served.read_text().strip()
        assert right.stderr == ""


def test_http_token_says_when_it_creates_a_token_and_where(short_dir: Path) -> None:
    env = home_env(short_dir / "home")
    (short_dir / "home").mkdir()
    data = short_dir / "data"
    args = (
        "http-token",
        "--socket",
        os.fspath(short_dir / "none.sock"),
        "--data-dir",
        os.fspath(data),
    )
    first = maple_acp(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stderr == f"maple-acp: created a new token in {data / 'http-token'}\n"
    again = maple_acp(*args, env=env)
    assert again.stdout == first.stdout
    assert again.stderr == ""


def _tls_files(directory: Path, key_mode: int) -> tuple[Path, Path]:
    # The mode is refused before the files are read as PEM: placeholders are enough.
    cert, key = directory / "cert.pem", directory / "key.pem"
    cert.write_text("certificate\n")
    key.write_text("key\n")
    key.chmod(key_mode)
    return cert, key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604], ids=["0644", "0640", "0604"])
def test_a_tls_key_others_can_read_stops_serve_in_one_line(short_dir: Path, mode: int) -> None:
    cert, key = _tls_files(short_dir, mode)
    command = [
        *("serve", "--socket", os.fspath(short_dir / "acp.sock")),
        *("--data-dir", os.fspath(short_dir / "data"), "--http", "127.0.0.1:0"),
        *("--tls-cert", os.fspath(cert), "--tls-key", os.fspath(key)),
    ]
    refused = maple_acp(*command)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert f"refusing the TLS key {key}" in refused.stderr
    assert f"(mode {mode:04o})" in refused.stderr
    assert "chmod 600" in refused.stderr
    assert not (short_dir / "acp.sock").exists()


def test_a_private_tls_key_passes_the_start_checks(tmp_path: Path) -> None:
    cert, key = _tls_files(tmp_path, 0o600)
    settings = NetworkSettings(
        host="127.0.0.1", port=0, data_dir=tmp_path, tls_cert=cert, tls_key=key
    )
    settings.check()
    key.chmod(0o644)
    with pytest.raises(HttpSetupError, match="other accounts can read or change it"):
        settings.check()


def test_the_http_help_says_what_a_host_may_be() -> None:
    shown = maple_acp("serve", "--help", env=clean_env(COLUMNS="200"))
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    assert "HOST is an IP address or localhost, not a host name" in text
    assert "[::1]:8765 for IPv6" in text
    refused = maple_acp("serve", "--http", "vm:8766")
    assert refused.returncode == 1
    assert "must be an IP address or localhost" in refused.stderr


def test_the_install_hint_works_from_a_checkout_and_from_an_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "hypercorn.config", None)
    settings = NetworkSettings(host="127.0.0.1", port=0, data_dir=tmp_path)
    with pytest.raises(HttpSetupError) as refused:
        settings.check_server_installed()
    assert "pip install -e '.[http]' in a checkout" in str(refused.value)
    assert "pip install 'maple-acp[http]' from a package index" in str(refused.value)
    assert INSTALL_HINT in str(refused.value)


async def _in_thread(
    function: Callable[..., subprocess.CompletedProcess[str]], *args: str
) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(lambda: function(*args))
