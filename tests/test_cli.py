"""The ``maple-acp`` command line's refusals and defaults, without a running host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from maple_acp.cli import cli, default_data_dir, format_status, prepare_data_dir


def test_default_data_dir_follows_xdg_and_falls_back_to_local_share() -> None:
    assert default_data_dir({"XDG_DATA_HOME": "/xdg/data"}) == Path("/xdg/data/maple-acp")
    home = Path(os.path.expanduser("~"))
    assert default_data_dir({}) == home / ".local/share/maple-acp"
    # A relative XDG value is ignored, as the base-directory rules say.
    assert default_data_dir({"XDG_DATA_HOME": "rel"}) == home / ".local/share/maple-acp"


def test_data_dir_is_created_private_and_a_shared_one_is_refused(tmp_path: Path) -> None:
    created = prepare_data_dir(tmp_path / "a" / "data")
    assert created.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    result = CliRunner().invoke(
        cli, ["serve", "--socket", str(tmp_path / "s.sock"), "--data-dir", str(shared)]
    )
    assert result.exit_code == 1
    assert "cannot use the data directory" in result.output
    assert "grants access to group or others" in result.output
    assert not (shared / "tasks.sqlite3").exists()


@pytest.mark.parametrize("root", ["relative/dir", "/definitely/not/here"])
def test_serve_refuses_a_bad_allowed_root(tmp_path: Path, root: str) -> None:
    result = CliRunner().invoke(
        cli,
        [
            *("serve", "--socket", str(tmp_path / "s.sock")),
            *("--data-dir", str(tmp_path / "d"), "--allowed-root", root),
        ],
    )
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "--allowed-root" in result.output


def test_serve_refuses_a_live_endpoint_before_opening_the_store(tmp_path: Path) -> None:
    path = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        result = CliRunner().invoke(
            cli, ["serve", "--socket", str(path), "--data-dir", str(tmp_path / "d")]
        )
    assert result.exit_code == 1
    assert result.output == f"maple-acp: another service is already listening at {path}\n"
    assert not (tmp_path / "d").exists()


def test_status_refuses_an_endpoint_that_is_not_a_socket(tmp_path: Path) -> None:
    impostor = tmp_path / "impostor.sock"
    impostor.write_text("")
    result = CliRunner().invoke(cli, ["status", "--socket", str(impostor)])
    assert result.exit_code == 1
    assert "not a socket" in result.output


def test_status_reports_a_peer_that_closes_without_answering(tmp_path: Path) -> None:
    path = tmp_path / "mute.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(1)

        def close_at_accept() -> None:
            # What a host at its connection limit does.
            conn, _ = listener.accept()
            conn.close()

        closer = threading.Thread(target=close_at_accept)
        closer.start()
        result = CliRunner().invoke(cli, ["status", "--socket", str(path)])
        closer.join()
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "closed the connection without answering" in result.output


def test_status_summary_names_every_counter() -> None:
    text = format_status(
        {
            "endpoint": "/run/x.sock",
            "signedIn": True,
            "connections": 3,
            "sessions": 2,
            "activeRuns": 1,
            "leases": 2,
        }
    )
    assert "/run/x.sock" in text
    assert "connections:  3" in text
    assert "sessions:     2" in text
    assert "active runs:  1" in text
    assert "leases:       2" in text


def test_version_from_click_matches_the_fast_path() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("maple-acp ")


@pytest.mark.parametrize("name", ["A-B", "", "1ABC", "X=Y"])
def test_serve_refuses_a_relay_name_that_is_not_an_environment_name(
    tmp_path: Path, name: str
) -> None:
    result = CliRunner().invoke(
        cli, ["serve", "--socket", str(tmp_path / "s.sock"), "--relay-allow", name]
    )
    assert result.exit_code == 2
    assert "is not an environment variable name" in result.output


def test_package_import_is_cheap_and_exports_resolve() -> None:
    """`import maple_acp` must not load trio (the entry point and host UIs import it)."""
    code = (
        "import sys, maple_acp; assert 'trio' not in sys.modules, 'trio loaded'; "
        "names = [getattr(maple_acp, n) for n in maple_acp.__all__]; print(len(names))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(__import__("maple_acp").__all__)
