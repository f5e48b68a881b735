"""Every error answer carries its one-line reason in ``data.details`` as well as in
``message``: some clients show an error's ``data.details`` and never its ``message``, so a
refusal without it reaches the user as a blank failure. ``data`` the error already had keeps
its keys."""

from __future__ import annotations

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
from maple_acp.testing.schema import AcpSchema, SchemaViolation, validate_frames


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path, config=AcpServiceConfig(protocol_max=2)) as running:
        yield running


@asynccontextmanager
async def connected(harness: Harness, version: int) -> AsyncIterator[AcpTestClient]:
    async with harness.connect() as client:
        params: dict[str, Any] = {"protocolVersion": 1, "clientCapabilities": {}}
        if version == 2:
            params = {
                "protocolVersion": 2,
                "info": {"name": "t", "version": "0"},
                "capabilities": {},
            }
        assert (await client.call("initialize", params))["protocolVersion"] == version
        yield client


def _answer(client: AcpTestClient, msg_id: Any) -> dict[str, Any] | None:
    for message in client.inbound():
        if isinstance(message, dict) and "method" not in message and message.get("id") == msg_id:
            return message
    return None


async def _error_of(client: AcpTestClient, line: dict[str, Any] | bytes, msg_id: Any) -> Any:
    raw = line if isinstance(line, bytes) else orjson.dumps(line)
    await client.send_raw(raw)
    with trio.fail_after(10):
        await client.wait_until(lambda: _answer(client, msg_id) is not None)
    answer = _answer(client, msg_id)
    assert answer is not None
    assert "error" in answer, answer
    return answer["error"]


@pytest.mark.parametrize("version", [1, 2])
async def test_every_kind_of_error_answer_carries_its_reason_in_data_details(
    both: Harness,
    project: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with connected(both, version) as client:
        sid = (await client.call("session/new", {"cwd": str(project), "mcpServers": []}))[
            "sessionId"
        ]
        errors = {
            # The reader's own answers: a line that is not JSON, a request that is not JSON-RPC.
            "parse": await _error_of(client, b'{"jsonrpc": "2.0", "id": 1, "method"', None),
            "invalid": await _error_of(
                client, {"jsonrpc": "2.0", "id": "bad", "method": 7, "params": {}}, "bad"
            ),
            # The peer's answer for a method nobody serves.
            "unknown method": await _error_of(
                client, {"jsonrpc": "2.0", "id": "m", "method": "_vendor/none"}, "m"
            ),
            # The edge's: bad params, and a session this connection does not hold (whose data
            # already names the session).
            "bad params": await _error_of(
                client,
                {
                    "jsonrpc": "2.0",
                    "id": "p",
                    "method": "session/new",
                    "params": {"cwd": "relative/dir", "mcpServers": []},
                },
                "p",
            ),
            "unknown session": await _error_of(
                client,
                {
                    "jsonrpc": "2.0",
                    "id": "s",
                    "method": "session/close",
                    "params": {"sessionId": "no-such-session"},
                },
                "s",
            ),
            # The runtime's, through the one table: a mode this host does not offer.
            "runtime": await _error_of(
                client,
                {
                    "jsonrpc": "2.0",
                    "id": "r",
                    "method": "session/set_config_option",
                    "params": {"sessionId": sid, "configId": "mode", "value": "nonsense"}
                    | ({"type": "id"} if version == 2 else {}),
                },
                "r",
            ),
        }
        codes = {kind: error["code"] for kind, error in errors.items()}
        assert codes == {
            "parse": -32700,
            "invalid": -32600,
            "unknown method": -32601,
            "bad params": -32602,
            "unknown session": -32002,
            "runtime": -32602,
        }
        for kind, error in errors.items():
            assert error["message"], kind
            assert error["data"]["details"] == error["message"], kind
        # Data the error had keeps its keys beside the reason.
        assert errors["unknown session"]["data"]["sessionId"] == "no-such-session"
        # The connection goes on.
        assert isinstance((await client.list_sessions())["sessions"], list)
        client.validate(acp_schema_v2 if version == 2 else acp_schema)


async def test_an_error_inside_a_v2_batch_answer_carries_its_reason_too(
    both: Harness, acp_schema_v2: AcpSchema
) -> None:
    async with connected(both, 2) as client:
        batch = [
            {"jsonrpc": "2.0", "id": "ok", "method": "session/list", "params": {}},
            {"jsonrpc": "2.0", "id": "nope", "method": "_vendor/none", "params": {}},
        ]
        await client.send_raw(orjson.dumps(batch))
        with trio.fail_after(10):
            await client.wait_until(lambda: bool(client.batch_answers()))
        [answer] = client.batch_answers()
        [error] = [member["error"] for member in answer if member["id"] == "nope"]
        assert error["code"] == -32601
        assert error["data"] == {"details": error["message"]}
        client.validate(acp_schema_v2)


@pytest.mark.parametrize(
    "error",
    [
        {"code": -32601, "message": "no"},
        {"code": -32601, "message": "no", "data": {"sessionId": "s"}},
        {"code": -32601, "message": "no", "data": {"details": "something else"}},
    ],
)
def test_the_test_clients_hold_every_error_to_the_rule(
    error: dict[str, Any], acp_schema: AcpSchema
) -> None:
    frame = {"jsonrpc": "2.0", "id": 1, "error": error}
    with pytest.raises(SchemaViolation, match=r"data\.details"):
        validate_frames(acp_schema, [("in", frame)])
    fixed = frame | {"error": error | {"data": (error.get("data") or {}) | {"details": "no"}}}
    assert validate_frames(acp_schema, [("in", fixed)]) == 1
