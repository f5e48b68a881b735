"""Interop over the network with clients nobody here wrote: the official Python SDK's WebSocket
and Streamable HTTP clients, and the TypeScript SDK 2.4.0's Streamable HTTP client, each
driving a real ``maple-acp serve --http`` through initialize, a streamed prompt, a permission
allowed and one denied, cancel, list, a reconnect that loads and resumes the session, and
close. Every message the host sent is checked against the ACP schema."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.testing.schema import AcpSchema, validate_frames

from .host_processes import MAPLE_ACP, Host, clean_env, run_command, running_host
from .npm_sdk import require_node, sdk_script

INTEROP = Path(__file__).parent / "interop"
PYTHON_CLIENT = INTEROP / "python_net_client.py"
TS_CLIENT = INTEROP / "ts_http_client.mjs"
#: The whole scripted scenario takes a few seconds; this only bounds a hang.
DEADLINE_S = 120.0
#: What the host logs once the network listener is up (the URL follows).
SERVING_AT = "serving ACP over WebSocket and HTTP at "


@asynccontextmanager
async def network_host(directory: Path) -> AsyncIterator[tuple[Host, str, str]]:
    """``maple-acp serve --http 127.0.0.1:0``, its URL and its token."""
    async with running_host(directory, "--http", "127.0.0.1:0") as host:
        line = await host.stderr.wait_for(lambda text: SERVING_AT in text)
        url = line.split(SERVING_AT, 1)[1].strip()
        token = run_command([*MAPLE_ACP, "http-token", "--data-dir", os.fspath(directory / "data")])
        assert token.returncode == 0, token.stderr
        yield host, url, token.stdout.strip()


def validate_log(schema: AcpSchema, path: Path) -> int:
    """Check the frames a client script logged, one connection at a time (each connection
    numbers its requests afresh)."""
    connections: list[list[tuple[str, Any]]] = []
    for entry in map(json.loads, path.read_text().splitlines()):
        if entry["direction"] == "connection":
            connections.append([])
        else:
            connections[-1].append((entry["direction"], entry["message"]))
    assert len(connections) == 2
    return sum(validate_frames(schema, frames) for frames in connections)


def check_report(report: dict[str, Any], project: Path) -> None:
    assert report["protocolVersion"] == 1
    assert report["streamed"] == 1000
    assert report["streamStop"] == "end_turn"
    assert report["permissions"] == ["allow", "reject"]
    assert (project / "allowed-marker").exists()
    assert not (project / "denied-marker").exists()
    assert report["cancelStop"] == "cancelled"
    assert report["listed"] is True
    # The reconnect's load replayed the whole history: the user's messages, the streamed
    # text, the tool rows.
    assert report["replayedText"] == 1000
    assert {"user_message_chunk", "agent_message_chunk", "tool_call"} <= set(
        report["replayedKinds"]
    )
    assert report["resumedModes"] is True
    # A closed session is still stored (close never deletes a prompted session).
    assert report["listedAfterClose"] is True


@pytest.mark.parametrize("kind", ["ws", "http"])
async def test_python_sdk_network_clients_drive_a_whole_session(
    tmp_path: Path, kind: str, acp_schema: AcpSchema
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    frames = tmp_path / "frames.jsonl"
    async with network_host(tmp_path) as (host, url, token):
        with trio.fail_after(DEADLINE_S):
            result = await trio.run_process(
                [
                    sys.executable,
                    os.fspath(PYTHON_CLIENT),
                    url,
                    token,
                    kind,
                    os.fspath(project.resolve()),
                    os.fspath(frames),
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=clean_env(),
            )
        assert result.returncode == 0, result.stderr.decode()[-3000:]
        report = json.loads(result.stdout.decode().strip().splitlines()[-1])
        check_report(report, project)
        assert report["wideText"] is True
        # Both network connections ended with their clients; the host serves on.
        await host.wait_status(lambda status: status["connections"] == 1)
    checked = validate_log(acp_schema, frames)
    assert checked > 20
    assert token not in host.stderr.text


async def test_typescript_sdk_http_client_drives_a_whole_session(
    tmp_path: Path, pytestconfig: pytest.Config, acp_schema: AcpSchema
) -> None:
    require_node("the network interop test")
    script = await sdk_script(pytestconfig, tmp_path / "npm", TS_CLIENT)
    project = tmp_path / "project"
    project.mkdir()
    frames = tmp_path / "frames.jsonl"
    async with network_host(tmp_path) as (host, url, token):
        with trio.fail_after(DEADLINE_S):
            result = await trio.run_process(
                [
                    "node",
                    os.fspath(script),
                    url,
                    token,
                    os.fspath(project.resolve()),
                    os.fspath(frames),
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=clean_env(),
            )
        assert result.returncode == 0, result.stderr.decode()[-3000:]
        report = json.loads(result.stdout.decode().strip().splitlines()[-1])
        check_report(report, project)
        await host.wait_status(lambda status: status["connections"] == 1)
    assert validate_log(acp_schema, frames) > 20


async def test_status_and_doctor_show_the_listener_never_the_token(tmp_path: Path) -> None:
    async with network_host(tmp_path) as (host, url, token):
        socket = ["--socket", os.fspath(host.socket)]
        shown = await trio.to_thread.run_sync(
            run_command, [*MAPLE_ACP, "status", *socket, "--json"]
        )
        assert json.loads(shown.stdout)["engine"]["http"] == url
        text = await trio.to_thread.run_sync(run_command, [*MAPLE_ACP, "status", *socket])
        assert f"network:      {url}" in text.stdout
        doctor = await trio.to_thread.run_sync(
            run_command,
            [*MAPLE_ACP, "doctor", *socket, "--data-dir", os.fspath(tmp_path / "data")],
        )
        assert f"✓ network listener: serving at {url}" in doctor.stdout
        for output in (shown.stdout, text.stdout, doctor.stdout, doctor.stderr):
            assert token not in output
    assert token not in host.stderr.text
