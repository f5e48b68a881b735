"""``session/fork`` over the socket: advertised, a copy of the history (whole or up to
``_meta.messageId``) that a load replays like the source's, hidden from ``session/list`` until
prompted, refused for an unknown or another account's session like a load; the source is
untouched. Answers validate against the unstable schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from edge_harness import Harness

from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import INVALID_PARAMS, RESOURCE_NOT_FOUND, ProtocolError


def replayed(client: AcpTestClient, sid: str) -> list[tuple[str, str]]:
    return [
        (u["sessionUpdate"], u["content"]["text"])
        for u in client.updates(sid)
        if u["sessionUpdate"].endswith("_message_chunk")
    ]


async def fork(client: AcpTestClient, sid: str, cwd: Path, **extra: Any) -> Any:
    return await client.call("session/fork", {"sessionId": sid, "cwd": str(cwd), **extra})


async def source(harness: Harness, project: Path) -> str:
    async with harness.connect(initialize=True) as client:
        sid: str = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo one")
        await client.prompt(sid, "/echo two")
        await client.close_session(sid)
    return sid


async def test_initialize_advertises_fork(harness: Harness, acp_schema: AcpSchema) -> None:
    async with harness.connect() as client:
        answer = await client.initialize()
    assert answer["agentCapabilities"]["sessionCapabilities"]["fork"] == {}
    acp_schema.validate("InitializeResponse", answer, unstable=True)


async def test_a_fork_replays_the_same_history_and_is_listed_only_once_prompted(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    sid = await source(harness, project)
    async with harness.connect(initialize=True) as client:
        answer = await fork(client, sid, project)
        forked = answer["sessionId"]
        assert forked != sid
        assert [s["sessionId"] for s in (await client.list_sessions())["sessions"]] == [sid]
        client.validate(acp_schema)
    # Not closed: the connection's end gives the unprompted fork the grace period.
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        await client.load_session(forked, str(project))
        assert replayed(client, forked) == replayed(client, sid)
        assert len(replayed(client, sid)) == 4
        assert (await client.prompt(forked, "/echo three"))["stopReason"] == "end_turn"
        listed = [s["sessionId"] for s in (await client.list_sessions())["sessions"]]
        assert sorted(listed) == sorted([sid, forked])
        client.validate(acp_schema)
    # The source did not change.
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        assert len(replayed(client, sid)) == 4


async def test_a_fork_up_to_a_message_id_ends_there(harness: Harness, project: Path) -> None:
    sid = await source(harness, project)
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        first_answer = next(
            u["messageId"]
            for u in client.updates(sid)
            if u["sessionUpdate"] == "agent_message_chunk"
        )
        forked = (await fork(client, sid, project, _meta={"messageId": first_answer}))["sessionId"]
        await client.prompt(forked, "/echo later")
        await client.close_session(forked)
    async with harness.connect(initialize=True) as client:
        await client.load_session(forked, str(project))
        assert replayed(client, forked) == [
            ("user_message_chunk", "/echo one"),
            ("agent_message_chunk", "one"),
            ("user_message_chunk", "/echo later"),
            ("agent_message_chunk", "later"),
        ]


async def test_an_unknown_or_another_accounts_session_is_not_found(
    harness: Harness, project: Path
) -> None:
    sid = await source(harness, project)
    async with harness.connect(initialize=True) as client:
        with pytest.raises(ProtocolError) as unknown:
            await fork(client, "no-such-session", project)
        assert unknown.value.code == RESOURCE_NOT_FOUND
        with pytest.raises(ProtocolError) as message:
            await fork(client, sid, project, _meta={"messageId": "no-such-message"})
        assert message.value.code == INVALID_PARAMS
        harness.runtime.sign_in("someone-else")
        with pytest.raises(ProtocolError) as other:
            await fork(client, sid, project)
        assert other.value.code == RESOURCE_NOT_FOUND
        assert other.value.message == unknown.value.message
        assert harness.runtime.status().leases == 0


async def test_an_unprompted_fork_is_swept_like_any_provisional_session(
    harness: Harness, project: Path
) -> None:
    sid = await source(harness, project)
    async with harness.connect(initialize=True) as client:
        forked = (await fork(client, sid, project))["sessionId"]
    # The connection ended without a close: the fork waits out the grace period, then goes.
    assert await harness.runtime.store.get_task(forked) is not None
    await harness.runtime.store.set_provisional_expiry(forked, 0)
    assert forked in await harness.runtime.sweep_provisional()
    async with harness.connect(initialize=True) as client:
        with pytest.raises(ProtocolError) as gone:
            await client.load_session(forked, str(project))
        assert gone.value.code == RESOURCE_NOT_FOUND
        await client.load_session(sid, str(project))
        assert len(replayed(client, sid)) == 4


def model_option(answer: Any) -> dict[str, Any]:
    option: dict[str, Any] = next(o for o in answer["configOptions"] if o["id"] == "model")
    return option


async def test_a_fork_of_a_prompted_session_keeps_its_locked_model(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    sid = await source(harness, project)
    change = {"configId": "model", "value": "demo-echo-large"}
    async with harness.connect(initialize=True) as client:
        answer = await fork(client, sid, project)
        forked = answer["sessionId"]
        # The copy holds the source's user messages: the model is locked, as the source's is.
        assert [o["value"] for o in model_option(answer)["options"]] == ["demo-echo"]
        with pytest.raises(ProtocolError) as refused:
            await client.call("session/set_config_option", {"sessionId": forked, **change})
        assert refused.value.code == INVALID_PARAMS
        # Its first prompt announces no lock: it was locked from the start.
        await client.prompt(forked, "/echo three")
        assert "config_option_update" not in {u["sessionUpdate"] for u in client.updates(forked)}
        client.validate(acp_schema)
    # A fork never prompted, loaded by another connection in its grace period: locked too.
    async with harness.connect(initialize=True) as client:
        unprompted = (await fork(client, sid, project))["sessionId"]
    async with harness.connect(initialize=True) as client:
        loaded = await client.load_session(unprompted, str(project))
        assert [o["value"] for o in model_option(loaded)["options"]] == ["demo-echo"]
        with pytest.raises(ProtocolError) as refused:
            await client.call("session/set_config_option", {"sessionId": unprompted, **change})
        assert refused.value.code == INVALID_PARAMS
        client.validate(acp_schema)


async def test_a_fork_of_a_session_never_prompted_may_still_choose_its_model(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        forked = (await fork(client, sid, project))["sessionId"]
        answer = await client.call(
            "session/set_config_option",
            {"sessionId": forked, "configId": "model", "value": "demo-echo-large"},
        )
        assert model_option(answer)["currentValue"] == "demo-echo-large"
        client.validate(acp_schema)
