"""JSON-RPC batches on an ACP v2 connection, as JSON-RPC 2.0 (section 6) says: one array
answer once every member is done, every member's id echoed exactly (integers of any size),
a malformed member answered inside the array while the others run; and single requests with
huge integer ids on v1 and v2. Every frame is checked against the schema where it parses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import Harness, running_service
from test_acp_v2 import v2_client

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema

#: Just past 64 bits, and 400 digits (past a double's range): orjson holds neither.
HUGE_IDS = (2**64 + 7, int("1" + "0" * 399))


@pytest.fixture
async def v2_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path, config=AcpServiceConfig(protocol_max=2)) as running:
        yield running


def call(msg_id: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def raw_answers(client: AcpTestClient) -> list[Any]:
    """Every line the agent sent that is not a notification or request, read exactly."""
    lines = [json.loads(f.raw) for f in client.frames if f.direction == "in"]
    return [m for m in lines if isinstance(m, list) or "method" not in m]


async def wait_for_answers(client: AcpTestClient, count: int) -> list[Any]:
    with trio.fail_after(10):
        await client.wait_until(lambda: len(raw_answers(client)) >= count)
    return raw_answers(client)


async def test_a_batch_gets_one_array_with_every_id_exact(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        before = len(raw_answers(client))
        batch = [
            call(HUGE_IDS[0], "session/new", {"cwd": str(project)}),
            call(HUGE_IDS[1], "session/list", {}),
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "none"}},
            call("s", "session/list", {"cwd": str(project)}),
        ]
        await client.send_raw(json.dumps(batch).encode())
        answers = (await wait_for_answers(client, before + 1))[before:]
        (array,) = answers
        assert isinstance(array, list)
        assert [m["id"] for m in array] == [HUGE_IDS[0], HUGE_IDS[1], "s"]
        assert array[0]["result"]["sessionId"]
        assert "sessions" in array[1]["result"]
        assert "sessions" in array[2]["result"]
        # The connection goes on, and no other answer came.
        await client.list_sessions()
        assert len(raw_answers(client)) == before + 2


async def test_a_slow_member_holds_the_array_and_a_bad_member_is_answered_inside(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        before = len(raw_answers(client))
        batch = [
            call(
                "p",
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "/echo hello"}]},
            ),
            7,
            {"jsonrpc": "2.0", "id": "no-method"},
            call("bad", "session/new", {"cwd": 5}),
            call("l", "session/list", {}),
        ]
        await client.send_raw(json.dumps(batch).encode())
        (array,) = (await wait_for_answers(client, before + 1))[before:]
        by_id = [(m["id"], m.get("error", {}).get("code")) for m in array]
        assert by_id == [("p", None), (None, -32600), (None, -32600), ("bad", -32602), ("l", None)]
        assert array[0]["result"]["messageId"]
        # The connection goes on, and every frame is valid v2.
        await client.list_sessions()
        client.validate(acp_schema_v2)
        assert client.batch_answers() == [array]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("huge", HUGE_IDS)
async def test_a_single_request_with_a_huge_id_is_echoed_exactly(
    v2_harness: Harness, version: int, huge: int
) -> None:
    async with v2_harness.connect() as client:
        params: dict[str, Any] = {"protocolVersion": version}
        if version == 1:
            params |= {"clientCapabilities": {}}
        else:
            params |= {"info": {"name": "t", "version": "0"}, "capabilities": {}}
        await client.call("initialize", params)
        before = len(raw_answers(client))
        await client.send_raw(json.dumps(call(huge, "session/list", {})).encode())
        (answer,) = (await wait_for_answers(client, before + 1))[before:]
        assert answer["id"] == huge
        assert "sessions" in answer["result"]
        assert str(huge).encode() in next(
            f.raw for f in reversed(client.frames) if f.direction == "in" and b"sessions" in f.raw
        )
