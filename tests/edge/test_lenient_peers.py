"""Where peers changed (Rust peers now leave out ``params``; upstream schema 1.22 refuses a
misspelled MCP transport): a request without params is read as ``{}``, a notification
without its required params is ignored and logged once per connection, and an MCP server
entry of an unknown ``type`` is ``-32602`` naming it, never started as a stdio server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path, config=AcpServiceConfig(protocol_max=2)) as running:
        yield running


@asynccontextmanager
async def connected(harness: Harness, version: int) -> AsyncIterator[AcpTestClient]:
    async with harness.connect() as client:
        params: dict[str, Any] = {"protocolVersion": version, "clientCapabilities": {}}
        if version == 2:
            params = {
                "protocolVersion": 2,
                "info": {"name": "t", "version": "0"},
                "capabilities": {},
            }
        assert (await client.call("initialize", params))["protocolVersion"] == version
        yield client


def answer_to(client: AcpTestClient, request_id: str) -> dict[str, Any] | None:
    for message in client.inbound():
        if (
            isinstance(message, dict)
            and message.get("id") == request_id
            and "method" not in message
        ):
            return message
    return None


@pytest.mark.parametrize("version", [1, 2])
async def test_a_request_without_params_is_read_as_an_empty_object(
    both: Harness,
    project: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with connected(both, version) as client:
        await client.call("session/new", {"cwd": str(project), "mcpServers": []})
        await client.send_raw(b'{"jsonrpc": "2.0", "id": "bare", "method": "session/list"}\n')
        with trio.fail_after(5):
            await client.wait_until(lambda: answer_to(client, "bare") is not None)
        answer = answer_to(client, "bare")
        assert answer is not None
        assert "error" not in answer, answer
        assert isinstance(answer["result"]["sessions"], list)
        # A method with a required field still names it.
        await client.send_raw(b'{"jsonrpc": "2.0", "id": "no-cwd", "method": "session/new"}\n')
        with trio.fail_after(5):
            await client.wait_until(lambda: answer_to(client, "no-cwd") is not None)
        refused = answer_to(client, "no-cwd")
        assert refused is not None
        assert refused["error"]["code"] == -32602
        assert "cwd" in refused["error"]["message"]
        client.validate(acp_schema_v2 if version == 2 else acp_schema)


@pytest.mark.parametrize("version", [1, 2])
async def test_a_notification_without_its_params_is_ignored_and_logged_once(
    both: Harness, project: Path, version: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp")
    async with connected(both, version) as client:
        sid = (await client.call("session/new", {"cwd": str(project), "mcpServers": []}))[
            "sessionId"
        ]
        for line in (
            {"jsonrpc": "2.0", "method": "session/cancel"},
            {"jsonrpc": "2.0", "method": "session/cancel", "params": None},
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {}},
        ):
            await client.send_raw(orjson.dumps(line) + b"\n")
        # The connection goes on, and a well-formed cancel still works.
        await client.list_sessions()
        ignored = [r for r in caplog.records if "malformed session/cancel" in r.getMessage()]
        assert len(ignored) == 1, [r.getMessage() for r in ignored]
        assert ignored[0].levelno == logging.INFO
        assert "sessionId" in ignored[0].getMessage()
        await client.cancel(sid)
        await client.list_sessions()


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("kind", ["htp", "websocket", "STDIO", ""])
async def test_an_mcp_server_of_an_unknown_type_is_refused_naming_it(
    both: Harness, project: Path, version: int, kind: str, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    server = {
        "type": kind,
        "name": "tools",
        "command": "/bin/sh",
        "args": ["-c", f"touch {started}"],
        "env": [],
    }
    async with connected(both, version) as client:
        before = len((await client.list_sessions())["sessions"])
        with pytest.raises(ProtocolError) as caught:
            await client.call("session/new", {"cwd": str(project), "mcpServers": [server]})
        assert caught.value.code == -32602
        assert f"'{kind}'" in caught.value.message
        assert "mcpServers[0].type" in caught.value.message
        assert len((await client.list_sessions())["sessions"]) == before
    assert not started.exists()


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("value", ["true", "false", 1, None])
async def test_a_boolean_config_value_that_is_not_a_boolean_is_bad_params(
    both: Harness, project: Path, version: int, value: Any
) -> None:
    async with connected(both, version) as client:
        new = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
        sid = new["sessionId"]
        change = {"sessionId": sid, "configId": "mode", "type": "boolean", "value": value}
        with pytest.raises(ProtocolError) as caught:
            await client.call("session/set_config_option", change)
        assert caught.value.code == -32602
        # Nothing changed, and the session goes on.
        answer = await client.call(
            "session/set_config_option",
            {"sessionId": sid, "configId": "mode", "value": "plan"}
            | ({"type": "id"} if version == 2 else {}),
        )
        [mode] = [o for o in answer["configOptions"] if o.get("id", o.get("configId")) == "mode"]
        assert mode["currentValue"] == "plan"
