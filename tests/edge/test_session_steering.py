"""``_session/steering`` over the socket: advertised; injected into a running turn (durable,
replayed in order on load, a pending permission left alone); a new turn with none running,
ended by ``_meta.steering.turnEnded``; ``promptRequired`` when asked; refusals like a
prompt's; a cancel or a close reaching a started turn. Every frame checked against the
schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient, allow
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import (
    INVALID_PARAMS,
    REQUEST_CANCELLED,
    RESOURCE_NOT_FOUND,
    ProtocolError,
)

STEER = "_session/steering"


async def steer(client: AcpTestClient, sid: str, text: str, **meta: Any) -> Any:
    params: dict[str, Any] = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    if meta:
        params["_meta"] = {"steering": meta}
    return await client.call(STEER, params)


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


async def test_initialize_advertises_steering(harness: Harness, acp_schema: AcpSchema) -> None:
    async with harness.connect() as client:
        answer = await client.initialize()
        client.validate(acp_schema)
    assert answer["_meta"]["steering"] == {"supported": True}
    # The goal extension is still advertised beside it.
    assert answer["_meta"]["goal"]["controlMethod"] == "_session/goal"


async def test_a_steer_reaches_the_running_turn_and_replays_in_order(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def prompt() -> None:
                answers.append(await client.prompt(sid, "/echo working\n/listen\n/echo done"))

            nursery.start_soon(prompt)
            await client.wait_until(
                lambda: ("agent_message_chunk", "working") in chunks(client, sid)
            )
            assert await steer(client, sid, "look at tests too") == {"outcome": "injected"}
        assert answers[0]["stopReason"] == "end_turn"
        assert chunks(client, sid)[-2:] == [
            ("agent_message_chunk", "steered: look at tests too"),
            ("agent_message_chunk", "done"),
        ]
        # An injected message starts no turn of its own.
        assert turn_ends(client, sid) == []
        client.validate(acp_schema)
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        assert chunks(client, sid) == [
            ("user_message_chunk", "/echo working\n/listen\n/echo done"),
            ("agent_message_chunk", "working"),
            ("user_message_chunk", "look at tests too"),
            ("agent_message_chunk", "steered: look at tests too"),
            ("agent_message_chunk", "done"),
        ]
        client.validate(acp_schema)


async def test_with_no_turn_running_a_steer_starts_one(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await steer(client, sid, "/echo hello\n/usage 3 4")
        assert answer == {"outcome": "startedNewTurn"}
        await client.wait_until(lambda: bool(turn_ends(client, sid)))
        ended = turn_ends(client, sid)
        assert ended[0]["stopReason"] == "end_turn"
        assert ended[0]["usage"]["inputTokens"] == 3
        inbound = client.inbound()
        answered = next(i for i, m in enumerate(inbound) if m.get("result") == answer)
        first_update = next(i for i, m in enumerate(inbound) if m.get("method") == "session/update")
        hello = next(
            i
            for i, m in enumerate(inbound)
            if m.get("method") == "session/update"
            and m["params"]["update"].get("content", {}).get("text") == "hello"
        )
        # The answer first (after the new session's own announcements), then the turn.
        assert first_update < answered < hello
        # The model locked with the first message, as after a prompt.
        assert any(u["sessionUpdate"] == "config_option_update" for u in client.updates(sid))
        # The session takes a prompt once that turn ended.
        assert (await client.prompt(sid, "/echo again"))["stopReason"] == "end_turn"
        client.validate(acp_schema)
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        assert chunks(client, sid)[:2] == [
            ("user_message_chunk", "/echo hello\n/usage 3 4"),
            ("agent_message_chunk", "hello"),
        ]


async def test_prompt_required_admits_nothing(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await steer(client, sid, "hello", idleBehavior="promptRequired")
        assert answer == {"outcome": "promptRequired", "reason": "noRunningTurn"}
        assert (await client.prompt(sid, "/echo first"))["stopReason"] == "end_turn"
        client.validate(acp_schema)
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        assert chunks(client, sid) == [
            ("user_message_chunk", "/echo first"),
            ("agent_message_chunk", "first"),
        ]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"sessionId": "nope", "prompt": [{"type": "text", "text": "x"}]}, RESOURCE_NOT_FOUND),
        ({"sessionId": "  ", "prompt": [{"type": "text", "text": "x"}]}, INVALID_PARAMS),
        ({"sessionId": "nope"}, INVALID_PARAMS),
        ({"sessionId": "nope", "prompt": []}, INVALID_PARAMS),
        ({"sessionId": "nope", "prompt": [{"type": "text", "text": "  "}]}, INVALID_PARAMS),
        # Blocks are checked before the session: an image is bad params, not unknown.
        (
            {"sessionId": "nope", "prompt": [{"type": "image", "data": "", "mimeType": "x"}]},
            INVALID_PARAMS,
        ),
        ({"sessionId": "nope", "prompt": "text"}, INVALID_PARAMS),
        (
            {
                "sessionId": "nope",
                "prompt": [{"type": "text", "text": "x"}],
                "_meta": {"steering": {"idleBehavior": "queue"}},
            },
            INVALID_PARAMS,
        ),
        (
            {
                "sessionId": "nope",
                "prompt": [{"type": "text", "text": "x"}],
                "_meta": {"steering": "promptRequired"},
            },
            INVALID_PARAMS,
        ),
    ],
)
async def test_bad_steering_is_refused_and_the_connection_stays_usable(
    harness: Harness, project: Path, acp_schema: AcpSchema, params: Any, code: int
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        with pytest.raises(ProtocolError) as caught:
            await client.call(STEER, params)
        assert caught.value.code == code
        # The same bad blocks on a real session are refused the same way.
        if code == INVALID_PARAMS and params["sessionId"] == "nope":
            with pytest.raises(ProtocolError) as again:
                await client.call(STEER, {**params, "sessionId": sid})
            assert again.value.code == INVALID_PARAMS
        assert (await client.prompt(sid, "/echo fine"))["stopReason"] == "end_turn"
        client.validate(acp_schema)
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        users = [text for kind, text in chunks(client, sid) if kind == "user_message_chunk"]
        assert users == ["/echo fine"]


async def test_another_connections_session_is_unknown(harness: Harness, project: Path) -> None:
    async with harness.connect(initialize=True) as owner:
        sid = (await owner.new_session(str(project)))["sessionId"]
        async with harness.connect(initialize=True) as other:
            with pytest.raises(ProtocolError) as caught:
                await steer(other, sid, "hi")
            assert caught.value.code == RESOURCE_NOT_FOUND


async def test_a_pending_permission_is_not_interrupted(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    asked = trio.Event()
    release = trio.Event()

    async def decide(params: Any) -> str:
        asked.set()
        await release.wait()
        return allow(params)

    async with harness.connect(initialize=True, permission=decide) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def prompt() -> None:
                answers.append(
                    await client.prompt(sid, '/tool shell {"command": "echo hi"}\n/echo done')
                )

            nursery.start_soon(prompt)
            await asked.wait()
            assert await steer(client, sid, "meanwhile") == {"outcome": "injected"}
            assert answers == []
            release.set()
        assert answers[0]["stopReason"] == "end_turn"
        statuses = [
            u.get("status") for u in client.updates(sid) if u["sessionUpdate"] == "tool_call_update"
        ]
        assert "completed" in statuses
        assert chunks(client, sid)[-2:] == [
            ("agent_message_chunk", "steered: meanwhile"),
            ("agent_message_chunk", "done"),
        ]
        client.validate(acp_schema)


async def test_a_cancel_ends_a_turn_a_steer_started(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await steer(client, sid, "/echo up\n/hang"))["outcome"] == "startedNewTurn"
        await client.wait_until(lambda: ("agent_message_chunk", "up") in chunks(client, sid))
        await client.cancel(sid)
        await client.wait_until(lambda: bool(turn_ends(client, sid)))
        assert turn_ends(client, sid)[0]["stopReason"] == "cancelled"
        # A steer into a turn a steer started is injected into it.
        assert (await steer(client, sid, "/listen"))["outcome"] == "startedNewTurn"
        assert (await steer(client, sid, "more"))["outcome"] == "injected"
        await client.wait_until(lambda: len(turn_ends(client, sid)) == 2)
        assert turn_ends(client, sid)[1]["stopReason"] == "end_turn"
        assert ("agent_message_chunk", "steered: more") in chunks(client, sid)
        client.validate(acp_schema)


async def test_closing_ends_a_turn_a_steer_started_with_nothing_after(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await steer(client, sid, "/echo up\n/hang"))["outcome"] == "startedNewTurn"
        await client.wait_until(lambda: ("agent_message_chunk", "up") in chunks(client, sid))
        closed = await client.call("session/close", {"sessionId": sid})
        inbound = client.inbound()
        at = next(i for i, m in enumerate(inbound) if m.get("result") == closed)
        later = [m for m in inbound[at + 1 :] if m.get("method") == "session/update"]
        assert later == []
        with pytest.raises(ProtocolError) as caught:
            await steer(client, sid, "hi")
        assert caught.value.code == RESOURCE_NOT_FOUND
        client.validate(acp_schema)


async def test_a_v2_connection_steers_like_a_v1_one(
    tmp_path: Path, project: Path, acp_schema_v2: AcpSchema
) -> None:
    """Advertised on v2 too; injected into a running turn; with none running it starts one,
    framed by its state_update running / idle (no turnEnded: idle already says it)."""
    config = AcpServiceConfig(protocol_max=2)
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        answer = await client.call(
            "initialize",
            {"protocolVersion": 2, "info": {"name": "t", "version": "0"}, "capabilities": {}},
        )
        assert answer["protocolVersion"] == 2
        assert answer["_meta"]["steering"] == {"supported": True}
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]

        def states() -> list[str]:
            return [
                u["state"] + (f":{u['stopReason']}" if u.get("stopReason") else "")
                for u in client.updates(sid)
                if u["sessionUpdate"] == "state_update"
            ]

        accepted = await client.prompt(sid, "/echo working\n/listen\n/echo done")
        assert accepted["messageId"]
        await client.wait_until(lambda: ("agent_message_chunk", "working") in chunks(client, sid))
        assert await steer(client, sid, "look at tests too") == {"outcome": "injected"}
        await client.wait_until(lambda: states()[-1:] == ["idle:end_turn"])
        texts = [text for kind, text in chunks(client, sid) if kind == "agent_message_chunk"]
        assert "steered: look at tests too" in texts

        assert await steer(client, sid, "/echo again") == {"outcome": "startedNewTurn"}
        await client.wait_until(lambda: states().count("idle:end_turn") == 2)
        assert states() == ["running", "idle:end_turn", "running", "idle:end_turn"]
        assert turn_ends(client, sid) == []
        assert await steer(client, sid, "later", idleBehavior="promptRequired") == {
            "outcome": "promptRequired",
            "reason": "noRunningTurn",
        }
        client.validate(acp_schema_v2)


def _skilled(project: Path) -> Path:
    skill = project / ".agents" / "skills" / "deploy"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("# deploy\n")
    return project


@pytest.mark.parametrize("ending", ["cancel", "close"])
async def test_a_steer_waiting_for_a_starting_prompt_is_refused_by_a_later_cancel_or_close(
    harness: Harness, project: Path, acp_schema: AcpSchema, ending: str
) -> None:
    _skilled(project)
    asked = trio.Event()

    async def hold_trust_question(params: Any) -> Any:
        # The project-trust question keeps the prompt from starting its run.
        asked.set()
        await trio.sleep_forever()

    async with harness.connect(initialize=True, permission=hold_trust_question) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        codes: list[int] = []
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def prompt() -> None:
                answers.append(await client.prompt(sid, "/echo first"))

            async def steering() -> None:
                with pytest.raises(ProtocolError) as caught:
                    await steer(client, sid, "waiting")
                codes.append(caught.value.code)

            nursery.start_soon(prompt)
            await asked.wait()
            nursery.start_soon(steering)
            await trio.testing.wait_all_tasks_blocked()
            assert codes == []  # it waits for the prompt's run
            if ending == "cancel":
                await client.cancel(sid)
            else:
                await client.call("session/close", {"sessionId": sid})
        assert codes == [REQUEST_CANCELLED if ending == "cancel" else RESOURCE_NOT_FOUND]
        assert answers[0]["stopReason"] == "cancelled"
        client.validate(acp_schema)
    # Nothing was stored: neither the prompt nor the steering message (a close even deleted
    # the session, never prompted).
    assert await harness.runtime.store.history(sid) == []
