"""v2 ``session/prompt`` with ``idempotencyKey``: a prompt sent again with its key inserts no
second user message and starts nothing; it is answered with the original's ``messageId``,
while the original's turn runs, after it ended, and after a host restart; a bad key is
``-32602``. Every frame is checked against ``acp-schema/v2``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import Harness, running_service
from test_acp_v2 import initialize_v2, states, v2_client, wait_idle

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError, v2

MAX_IDEMPOTENCY_KEY_CHARS = v2.MAX_IDEMPOTENCY_KEY_CHARS

V2_CONFIG = AcpServiceConfig(protocol_max=2)


@pytest.fixture
async def v2_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path, config=V2_CONFIG) as running:
        yield running


def keyed(sid: str, text: str, key: Any) -> dict[str, Any]:
    return {
        "sessionId": sid,
        "prompt": [{"type": "text", "text": text}],
        "idempotencyKey": key,
    }


def user_messages(client: Any, sid: str) -> list[str]:
    kinds = ("user_message_chunk", "user_message")
    return [u["messageId"] for u in client.updates(sid) if u["sessionUpdate"] in kinds]


async def test_a_retry_while_the_turn_runs_gets_the_same_message_id(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        first = await client.call("session/prompt", keyed(sid, "/hang", "key-1"))
        again = await client.call("session/prompt", keyed(sid, "/hang", "key-1"))
        assert again == first
        # One message, one run: the retry did not wait in the queue for a turn of its own.
        assert user_messages(client, sid) == [first["messageId"]]
        assert states(client, sid) == ["running"]
        # Two retries written together while the turn runs: the same answer each.
        answers: list[Any] = []

        async def retry() -> None:
            answers.append(await client.call("session/prompt", keyed(sid, "/hang", "key-1")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(retry)
            nursery.start_soon(retry)
        assert answers == [first, first]
        await client.cancel(sid)
        await wait_idle(client, sid)
        assert user_messages(client, sid) == [first["messageId"]]
        client.validate(acp_schema_v2)


async def test_prompts_written_together_with_one_key_insert_one_message(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        answers: list[Any] = []

        async def send() -> None:
            answers.append(await client.call("session/prompt", keyed(sid, "/echo once", "k")))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(send)
        assert len({a["messageId"] for a in answers}) == 1
        await wait_idle(client, sid)
        assert states(client, sid) == ["running", "idle:end_turn"]
        assert client.text(sid) == "once"
        client.validate(acp_schema_v2)


async def test_a_retry_after_the_turn_ended_and_after_a_restart_starts_nothing(
    tmp_path: Path, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with (
        running_service(tmp_path, config=V2_CONFIG) as harness,
        v2_client(harness) as client,
    ):
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        first = await client.call("session/prompt", keyed(sid, "/echo done", "key-a"))
        await wait_idle(client, sid)
        seen = len(client.updates(sid))
        assert await client.call("session/prompt", keyed(sid, "/echo done", "key-a")) == first
        # A new key is a new prompt.
        other = await client.call("session/prompt", keyed(sid, "/echo more", "key-b"))
        assert other["messageId"] != first["messageId"]
        await wait_idle(client, sid, 2)
        assert states(client, sid) == ["running", "idle:end_turn"] * 2
        assert user_messages(client, sid)[-1] == other["messageId"]
        assert len(client.updates(sid)) > seen
        client.validate(acp_schema_v2)
    # The same data directory, a new host: the key is remembered with its message.
    async with (
        running_service(tmp_path, config=V2_CONFIG) as harness,
        harness.connect() as client,
    ):
        await initialize_v2(client)
        await client.call("session/resume", {"sessionId": sid, "cwd": str(project)})
        seen = len(client.updates(sid))
        assert await client.call("session/prompt", keyed(sid, "/echo done", "key-a")) == first
        assert client.updates(sid)[seen:] == []  # no echo, no run
        await client.call(
            "session/resume",
            {"sessionId": sid, "cwd": str(project), "replayFrom": {"type": "start"}},
        )
        said = [t for k, _, t in client.messages(sid) if k == "user_message"]
        assert said == ["/echo done", "/echo more"]
        client.validate(acp_schema_v2)


@pytest.mark.parametrize(
    "key", [7, None, "", "x" * (MAX_IDEMPOTENCY_KEY_CHARS + 1), ["k"], {"k": 1}, True]
)
async def test_a_bad_key_is_bad_params(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema, key: Any
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        if key is None:
            # An explicit null is no key: a plain prompt.
            await client.call("session/prompt", keyed(sid, "/echo ok", key))
            await wait_idle(client, sid)
            return
        with pytest.raises(ProtocolError) as caught:
            await client.call("session/prompt", keyed(sid, "/echo no", key))
        assert caught.value.code == -32602
        assert "idempotencyKey" in caught.value.message
        assert client.updates(sid)[1:] == []  # past its commands, nothing
        # The longest key is fine, and the connection goes on.
        longest = "k" * MAX_IDEMPOTENCY_KEY_CHARS
        await client.call("session/prompt", keyed(sid, "/echo ok", longest))
        await wait_idle(client, sid)
        client.validate(acp_schema_v2)
