"""ACP v2 through ``maple-acp serve`` and a real connector: a session that lives across a
restart of the host, and the switch that pins every client to v1."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.config import ConfigFileError, parse_config, resolve_serve_settings
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema

from .host_processes import DEADLINE, connector_client, running_host

V2_INITIALIZE = {"protocolVersion": 2, "info": {"name": "e2e", "version": "0"}}


async def _idle_count(client: AcpTestClient, sid: str, count: int) -> None:
    def idles() -> int:
        return sum(
            1
            for u in client.updates(sid)
            if u["sessionUpdate"] == "state_update" and u["state"] == "idle"
        )

    await client.wait_until(lambda: idles() >= count)


async def test_a_v2_session_resumes_with_its_history_after_a_restart(
    short_dir: Path, project: Path, acp_schema_v2: AcpSchema
) -> None:
    cwd = os.fspath(project)
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host, connector_client(host.socket) as first:
            client = first.client
            assert (await client.call("initialize", V2_INITIALIZE))["protocolVersion"] == 2
            sid = (await client.call("session/new", {"cwd": cwd}))["sessionId"]
            await client.prompt(sid, "/echo before the restart")
            await _idle_count(client, sid, 1)
            client.validate(acp_schema_v2)
        async with running_host(short_dir) as host, connector_client(host.socket) as second:
            client = second.client
            assert (await client.call("initialize", V2_INITIALIZE))["protocolVersion"] == 2
            await client.call(
                "session/resume", {"sessionId": sid, "cwd": cwd, "replayFrom": {"type": "start"}}
            )
            assert [t for k, _, t in client.messages(sid) if k == "agent_message"] == [
                "before the restart"
            ]
            assert client.updates(sid)[-2:] == [
                {"sessionUpdate": "state_update", "state": "idle"},
                {"sessionUpdate": "replay_complete"},
            ]
            await client.prompt(sid, "/echo after")
            await _idle_count(client, sid, 2)
            assert client.text(sid).endswith("after")
            client.validate(acp_schema_v2)


async def test_protocol_max_1_pins_every_client_to_v1(
    short_dir: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with (
            running_host(short_dir, "--protocol-max", "1") as host,
            connector_client(host.socket) as connector,
        ):
            client = connector.client
            answer: Any = await client.call("initialize", V2_INITIALIZE)
            assert answer["protocolVersion"] == 1
            client.validate(acp_schema)


def test_protocol_max_in_the_config_file(tmp_path: Path) -> None:
    config = parse_config("protocol_max = 1\n", tmp_path / "c.toml")
    assert resolve_serve_settings({}, {}, config).protocol_max == 1
    assert resolve_serve_settings({}, {}, parse_config("", tmp_path / "d.toml")).protocol_max == 2
    for bad in ("3", "0", '"2"', "true"):
        with pytest.raises(ConfigFileError, match="protocol_max"):
            parse_config(f"protocol_max = {bad}\n", tmp_path / "e.toml")
