"""``_session/steering`` through ``maple-acp serve`` and a real connector process, every frame
the agent sends checked against the ACP schema: advertised; injected into a running turn and
replayed in order by a load; a new turn with none running, ended by ``turnEnded``;
``promptRequired`` when asked; a bad message refused with the connection still usable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

from .host_processes import DEADLINE, assert_only_protocol_lines, connector_client, running_host

STEER = "_session/steering"
OUTCOMES = {"injected", "startedNewTurn", "promptRequired"}


async def steer(client: AcpTestClient, sid: str, text: str, **meta: Any) -> Any:
    params: dict[str, Any] = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    if meta:
        params["_meta"] = {"steering": meta}
    answer = await client.call(STEER, params)
    # The extension's answer shape (the ACP schema leaves extension answers open).
    assert set(answer) <= {"outcome", "reason"}
    assert answer["outcome"] in OUTCOMES
    return answer


def chunks(client: AcpTestClient, sid: str) -> list[tuple[str, str]]:
    return [
        (u["sessionUpdate"], u["content"]["text"])
        for u in client.updates(sid)
        if u["sessionUpdate"].endswith("_message_chunk")
    ]


def turn_ends(client: AcpTestClient, sid: str) -> list[Any]:
    return [
        u["_meta"]["steering"]["turnEnded"]
        for u in client.updates(sid)
        if u["sessionUpdate"] == "session_info_update" and "steering" in u.get("_meta", {})
    ]


async def test_steering_through_a_real_connector(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host, connector_client(host.socket) as connector:
            client = connector.client
            answer = await client.initialize()
            assert answer["_meta"]["steering"] == {"supported": True}
            sid = (await client.new_session(os.fspath(project)))["sessionId"]

            # Idle, asked not to start a turn: nothing happens.
            idle = await steer(client, sid, "too early", idleBehavior="promptRequired")
            assert idle == {"outcome": "promptRequired", "reason": "noRunningTurn"}

            # Into a running prompt turn.
            async with trio.open_nursery() as nursery:
                answers: list[Any] = []

                async def prompt() -> None:
                    answers.append(await client.prompt(sid, "/echo working\n/listen"))

                nursery.start_soon(prompt)
                working = ("agent_message_chunk", "working")
                await client.wait_until(lambda: working in chunks(client, sid))
                assert await steer(client, sid, "mind the tests") == {"outcome": "injected"}
            assert answers[0]["stopReason"] == "end_turn"
            assert chunks(client, sid)[-1] == ("agent_message_chunk", "steered: mind the tests")

            # With no turn running: a new one, ended by turnEnded.
            started = await steer(client, sid, "/echo on my own")
            assert started == {"outcome": "startedNewTurn"}
            await client.wait_until(lambda: bool(turn_ends(client, sid)))
            assert turn_ends(client, sid)[0]["stopReason"] == "end_turn"
            assert chunks(client, sid)[-1] == ("agent_message_chunk", "on my own")

            # A refused block: bad params, and the connection goes on.
            bad = {"sessionId": sid, "prompt": [{"type": "audio", "data": "", "mimeType": "x"}]}
            with pytest.raises(ProtocolError) as refused:
                await client.call(STEER, bad)
            assert refused.value.code == -32602

            assert await client.close_session(sid) == {}
            before = len(chunks(client, sid))
            await client.load_session(sid, os.fspath(project))
            # The replay shows each steering message where it came, once.
            assert chunks(client, sid)[before:] == [
                ("user_message_chunk", "/echo working\n/listen"),
                ("agent_message_chunk", "working"),
                ("user_message_chunk", "mind the tests"),
                ("agent_message_chunk", "steered: mind the tests"),
                ("user_message_chunk", "/echo on my own"),
                ("agent_message_chunk", "on my own"),
            ]
            client.validate(acp_schema)
            assert_only_protocol_lines(client)
