"""``maple-acp serve`` as a new user starts it: fresh directories, a config file, the
environment, JSON logs; checked with ``maple-acp status`` in real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import trio

from .host_processes import (
    DEADLINE,
    MAPLE_ACP,
    SERVE,
    LineReader,
    connector_client,
    home_env,
    run_command,
    running_host,
    start_logged_process,
)


def fresh_env(home: Path, **extra: str) -> dict[str, str]:
    """A new account: an empty home, no XDG or maple-acp settings from outside."""
    home.mkdir(exist_ok=True)
    return home_env(home, **extra)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_command([*MAPLE_ACP, *args], env=env)


async def start_serve(
    nursery: trio.Nursery, args: list[str], env: dict[str, str], ready: str
) -> tuple[trio.Process, LineReader]:
    return await start_logged_process(
        nursery, [*SERVE, *args], env=env, ready=lambda line: ready in line, stdout=subprocess.PIPE
    )


async def test_serve_in_fresh_directories_creates_them_private(short_dir: Path) -> None:
    """`serve --socket /tmp/x/acp.sock --data-dir /tmp/x/data` with /tmp/x not there yet."""
    base = short_dir / "x"
    env = fresh_env(short_dir / "home")
    args = ["--socket", os.fspath(base / "acp.sock"), "--data-dir", os.fspath(base / "data")]
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            process, stderr = await start_serve(nursery, args, env, "maple-acp: serving on")
            for directory in (base, base / "data"):
                assert directory.stat().st_mode & 0o777 == 0o700, directory
            query = ["status", "--json", "--socket", os.fspath(base / "acp.sock")]
            status = await trio.to_thread.run_sync(lambda: run_cli(*query, env=env))
            assert status.returncode == 0, status.stderr
            report = json.loads(status.stdout)
            assert report["running"] is True
            assert report["endpoint"] == os.fspath(base / "acp.sock")
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
            await stderr.wait_closed()
    assert stderr.lines[-1] == "maple-acp: stopped"
    assert not (base / "acp.sock").exists()


async def test_config_file_environment_and_flags_decide_in_that_order(short_dir: Path) -> None:
    """The file sets the socket, the data directory and JSON logs; the environment overrides
    the data directory; `status` with no flags finds the host through the same file."""
    config_home = short_dir / "cfg"
    (config_home / "maple-acp").mkdir(parents=True)
    socket_path = short_dir / "run" / "acp.sock"
    (config_home / "maple-acp" / "config.toml").write_text(
        f'socket = "{socket_path}"\n'
        f'data_dir = "{short_dir / "file-data"}"\n'
        'log_format = "json"\n'
        'log_level = "error"\n'
        "max_connections = 3\n"
    )
    env = fresh_env(
        short_dir / "home",
        XDG_CONFIG_HOME=os.fspath(config_home),
        MAPLE_ACP_DATA_DIR=os.fspath(short_dir / "env-data"),
        MAPLE_ACP_LOG_LEVEL="info",
    )
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            # The flag wins over the file's log_format (and the environment's level over the
            # file's): text lines at INFO.
            process, stderr = await start_serve(
                nursery, ["--log-format", "text"], env, f"maple-acp: serving on {socket_path}"
            )
            assert any(" INFO " in line for line in stderr.lines), stderr.lines
            status = await trio.to_thread.run_sync(lambda: run_cli("status", "--json", env=env))
            assert status.returncode == 0, status.stderr
            assert json.loads(status.stdout)["endpoint"] == os.fspath(socket_path)
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0
    assert (short_dir / "env-data" / "tasks.sqlite3").exists()
    assert not (short_dir / "file-data").exists()


async def test_json_log_format_writes_one_object_per_line(short_dir: Path) -> None:
    env = fresh_env(short_dir / "home")
    socket_path = short_dir / "run" / "acp.sock"
    args = ["--socket", os.fspath(socket_path), "--data-dir", os.fspath(short_dir / "data")]
    args += ["--log-format", "json", "--log-level", "debug"]
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            process, stderr = await start_serve(nursery, args, env, "serving on")
            status = await trio.to_thread.run_sync(
                lambda: run_cli("status", "--socket", os.fspath(socket_path), env=env)
            )
            assert status.returncode == 0, status.stderr
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
            await stderr.wait_closed()
    entries = [json.loads(line) for line in stderr.lines if line]
    assert len(entries) >= 3
    for entry in entries:
        assert set(entry) >= {"time", "level", "logger", "message"}, entry
    assert entries[-1]["message"] == "maple-acp: stopped"
    assert any(entry["level"] == "debug" for entry in entries)
    assert any(entry["message"].startswith("maple-acp: serving on") for entry in entries)


async def test_debug_logs_and_transcripts_never_show_a_relayed_secret(
    short_dir: Path, project: Path
) -> None:
    """A relayed value printed by a tool reaches the client redacted, and appears in no log
    line at DEBUG (text and JSON) and in no transcript `sessions show` prints."""
    secret = "relay-secret-7d41c9e2aa"
    relay_env = {"MAPLE_ACP_RELAY_ENV": "PLANTED_TOKEN", "PLANTED_TOKEN": secret}
    with trio.fail_after(DEADLINE):
        async with running_host(
            short_dir, "--relay-allow", "PLANTED_TOKEN", "--log-level", "debug"
        ) as host:
            async with connector_client(host.socket, env=relay_env) as connector:
                client = connector.client
                await client.initialize()
                session_id = (await client.new_session(os.fspath(project)))["sessionId"]
                answer = await client.prompt(
                    session_id, '/tool shell {"command": "echo token=$PLANTED_TOKEN"}'
                )
                assert answer["stopReason"] == "end_turn"
                frames = b"\n".join(frame.raw for frame in client.frames if frame.direction == "in")
                assert b"token=" in frames  # the tool ran and its output came back
                assert secret.encode() not in frames
                await client.close_session(session_id)
            command = [
                *MAPLE_ACP,
                "sessions",
                "show",
                session_id,
                "--socket",
                os.fspath(host.socket),
            ]
            shown = await trio.to_thread.run_sync(run_command, command)
            assert shown.returncode == 0, shown.stderr
            assert "token=" in shown.stdout
            assert secret not in shown.stdout
    assert any(" DEBUG " in line for line in host.stderr.lines)
    assert not any(secret in line for line in host.stderr.lines)
