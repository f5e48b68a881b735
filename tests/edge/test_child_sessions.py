"""Child sessions on the wire (the demo's ``/delegate``): a v1 client that declared
``clientCapabilities.subagents`` and every v2 client see each child as a session of its own
(announced by the parent's ``subagent_update`` before anything names it, its own updates
under its id, ``session_message`` upserts for the delegation and the answer, state patches,
``cancel`` per child); any other v1 client sees the delegate tool call streaming the child's
text, its permission question asked on the parent's session. Every frame is validated against
the negotiated version's schema; the child shapes against its unstable file, the only one
that defines them."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service
from test_acp_v2 import v2_client, wait_idle

from maple_acp.edge import CLOSE_DEADLINE_S, AcpServiceConfig
from maple_acp.testing.client import AcpTestClient, HeldPermissions, reject
from maple_acp.testing.images import png
from maple_acp.testing.schema import (
    OUTBOUND_DEFINITIONS,
    V2_OUTBOUND_DEFINITIONS,
    AcpSchema,
    SchemaViolation,
)
from maple_acp.wire import ProtocolError

#: The update kinds only the unstable files define.
CHILD_KINDS = frozenset({"subagent_update", "session_message", "session_message_chunk"})
DELEGATE = "/delegate Survey :: list the files"


class ChildSessionsSchema(AcpSchema):
    """The negotiated version's schema, reading the child shapes from its unstable file."""

    def validate_outbound(self, method: str, params: Any) -> None:
        kind = params.get("update", {}).get("sessionUpdate") if method == "session/update" else None
        if kind not in CHILD_KINDS:
            super().validate_outbound(method, params)
            return
        table = V2_OUTBOUND_DEFINITIONS if self.version == 2 else OUTBOUND_DEFINITIONS
        self.validate(table[method], params, unstable=True)


@pytest.fixture
async def harness(tmp_path: Path) -> Any:
    config = AcpServiceConfig(protocol_max=2, allow_session_delete=True)
    async with running_service(tmp_path, config=config) as running:
        yield running


def child_updates(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    return [u for u in client.updates(sid) if u["sessionUpdate"] in CHILD_KINDS]


def child_id_of(client: AcpTestClient, sid: str) -> str:
    first = child_updates(client, sid)[0]
    assert first["sessionUpdate"] == "subagent_update"
    child: str = first["sessionId"]
    return child


def session_ids_in_order(client: AcpTestClient) -> list[tuple[str, str]]:
    """Every ``session/update`` as (its session id, its kind), in arrival order."""
    return [
        (m["params"]["sessionId"], m["params"]["update"]["sessionUpdate"])
        for m in client.inbound()
        if isinstance(m, dict) and m.get("method") == "session/update"
    ]


def expect_child_on_the_wire(client: AcpTestClient, sid: str) -> str:
    """The whole delegation as a client that shows children sees it."""
    child = child_id_of(client, sid)
    parent = child_updates(client, sid)
    assert parent[0] == {
        "sessionUpdate": "subagent_update",
        "sessionId": child,
        "title": "Survey",
        "capabilities": {"cancel": {}},
    }
    messages = [u for u in parent if u["sessionUpdate"] == "session_message"]
    assert [(m["senderSessionId"], m["recipientSessionId"]) for m in messages] == [
        (sid, child),
        (child, sid),
    ]
    assert messages[0]["content"] == [{"type": "text", "text": "list the files"}]
    assert messages[1]["content"] == [{"type": "text", "text": "answer: list the files"}]
    states = [
        u["state"] for u in parent if u["sessionUpdate"] == "subagent_update" and "state" in u
    ]
    assert states == [
        {"state": "running"},
        {"state": "requires_action"},
        {"state": "running"},
        {"state": "idle", "stopReason": "end_turn"},
    ]
    # The announcement comes before anything names the child.
    order = session_ids_in_order(client)
    assert order.index((sid, "subagent_update")) < min(
        i for i, (session, _) in enumerate(order) if session == child
    )
    # The child's own updates carry its id: its text and its shell call.
    assert "working on: list the files" in client.text(child) or any(
        u["sessionUpdate"] == "agent_message" for u in client.updates(child)
    )
    tools = [u for u in client.updates(child) if u["sessionUpdate"].startswith("tool_call")]
    assert tools
    assert not [u for u in client.updates(sid) if u.get("title") == "shell: echo child"]
    # Its permission question was asked with the child's id.
    assert [p["sessionId"] for p in client.permission_requests] == [child]
    return child


async def test_a_v1_client_that_declared_subagents_sees_the_child_as_a_session(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        await client.initialize(clientCapabilities={"subagents": {}})
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, DELEGATE)
        assert answer["stopReason"] == "end_turn"
        expect_child_on_the_wire(client, sid)
        client.validate(ChildSessionsSchema(acp_schema.directory))
        # The stable 1.29 file does not know them: the unstable one is the one that judges.
        with pytest.raises(SchemaViolation):
            client.validate(acp_schema)


async def test_a_v1_client_without_the_capability_sees_a_tool_call(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, DELEGATE)
        updates = client.updates(sid)
        assert not [u for u in updates if u["sessionUpdate"] in CHILD_KINDS]
        # Only the parent's session is ever named.
        assert {session for session, _ in session_ids_in_order(client)} == {sid}
        delegate = next(u for u in updates if u.get("title") == "Survey")
        call = delegate["toolCallId"]
        streamed = [
            u["content"][0]["content"]["text"]
            for u in updates
            if u.get("toolCallId") == call and u.get("content")
        ]
        assert "working on: list the files" in streamed
        assert streamed[-1] == "answer: list the files"
        # The child's question: the parent's session, the delegate call's id.
        [asked] = client.permission_requests
        assert (asked["sessionId"], asked["toolCall"]["toolCallId"]) == (sid, call)
        client.validate(acp_schema)


async def test_a_v2_client_sees_the_child_as_a_session(
    harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, DELEGATE)
        await wait_idle(client, sid)
        child = expect_child_on_the_wire(client, sid)
        child_states = [
            u["state"] for u in client.updates(child) if u["sessionUpdate"] == "state_update"
        ]
        assert child_states[0] == "running"
        assert child_states[-1] == "idle"
        client.validate(ChildSessionsSchema(acp_schema_v2.directory))


async def test_a_denied_child_permission_fails_closed_and_the_parent_goes_on(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(permission=reject) as client:
        await client.initialize(clientCapabilities={"subagents": {}})
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, DELEGATE + "\n/echo parent goes on")
        assert answer["stopReason"] == "end_turn"
        child = child_id_of(client, sid)
        shell = [
            u
            for u in client.updates(child)
            if u["sessionUpdate"] == "tool_call_update" and u.get("status") == "failed"
        ]
        assert shell
        assert "parent goes on" in client.text(sid)
        client.validate(ChildSessionsSchema(acp_schema.directory))


async def test_cancelling_a_child_stops_it_alone(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        await client.initialize(clientCapabilities={"subagents": {}})
        sid = (await client.new_session(str(project)))["sessionId"]
        request = await client.send(
            "session/prompt",
            {
                "sessionId": sid,
                "prompt": [{"type": "text", "text": "/delegate T :: /hang\n/echo on"}],
            },
        )
        with trio.fail_after(10):
            await client.wait_until(
                lambda: any(
                    u.get("state") == {"state": "running"} for u in child_updates(client, sid)
                )
            )
        child = child_id_of(client, sid)
        await client.cancel(child)
        with trio.fail_after(10):
            await client.wait_until(lambda: client.answer(request) is not None)
        assert client.answer(request)["result"]["stopReason"] == "end_turn"
        final = child_updates(client, sid)[-1]
        assert final["state"] == {"state": "idle", "stopReason": "cancelled"}
        assert "on" in client.text(sid)
        client.validate(ChildSessionsSchema(acp_schema.directory))


async def test_cancelling_the_parent_cancels_its_child(
    harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    held = HeldPermissions()
    async with v2_client(harness, permission=held) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, DELEGATE)
        # The child waits on its permission question; the parent's cancel ends both.
        await held.wait_pending()
        await client.cancel(sid)
        await wait_idle(client, sid)
        assert client.updates(sid)[-1]["stopReason"] == "cancelled"
        final = [u for u in child_updates(client, sid) if "state" in u][-1]
        assert final["state"] == {"state": "idle", "stopReason": "cancelled"}
        client.validate(ChildSessionsSchema(acp_schema_v2.directory))


async def test_load_replays_each_child_after_its_announcement(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as writer:
        await writer.initialize(clientCapabilities={"subagents": {}})
        sid = (await writer.new_session(str(project)))["sessionId"]
        await writer.prompt(sid, "/echo before\n/delegate A :: /echo from a\n/echo between")
        await writer.prompt(sid, "/delegate B :: /echo from b")
        await writer.call("session/close", {"sessionId": sid})
    async with harness.connect() as client:
        await client.initialize(clientCapabilities={"subagents": {}})
        await client.load_session(sid, str(project))
        order = session_ids_in_order(client)
        children = [u["sessionId"] for u in child_updates(client, sid) if "title" in u]
        assert len(children) == 2
        a, b = children
        first_a = order.index((a, "agent_message_chunk"))
        assert order.index((sid, "subagent_update")) < first_a
        assert client.text(a) == "from a"
        assert client.text(b) == "from b"
        text = client.text(sid)
        assert text.index("before") < text.index("between")
        # A's transcript sits between the parent's "before" and "between" messages.
        parent_texts = [
            i for i, (s, k) in enumerate(order) if s == sid and k == "agent_message_chunk"
        ]
        assert parent_texts[0] < first_a < parent_texts[1]
        assert first_a < order.index((b, "agent_message_chunk"))
        client.validate(ChildSessionsSchema(acp_schema.directory))
        # Listed: the parent only; a child's id is refused for load and delete.
        listed = [s["sessionId"] for s in (await client.list_sessions())["sessions"]]
        assert listed == [sid]
        for method, params in (
            ("session/load", {"sessionId": a, "cwd": str(project), "mcpServers": []}),
            ("session/delete", {"sessionId": a}),
        ):
            with pytest.raises(ProtocolError) as refused:
                await client.call(method, params)
            assert refused.value.code == -32602
            assert refused.value.message == "a child session: use its parent"
        # Deleting the parent deletes its children.
        await client.delete_session(sid)
        store = harness.runtime.store
        assert await store.children(sid) == []
        for child in (a, b):
            assert await store.get_task(child) is None


async def test_closing_the_parent_ends_its_child_within_the_close_deadline(
    autojump_clock: trio.testing.MockClock, harness: Harness, project: Path
) -> None:
    held = HeldPermissions()
    async with harness.connect(permission=held) as client:
        await client.initialize(clientCapabilities={"subagents": {}})
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def prompt() -> None:
                answers.append(await client.prompt(sid, DELEGATE))

            nursery.start_soon(prompt)
            # The child waits on its permission question inside the parent's run.
            await held.wait_pending()
            lease = harness.runtime.lease_of(sid)
            assert lease is not None
            assert len(lease.running_children) == 1
            before = trio.current_time()
            await client.close_session(sid)
            assert trio.current_time() - before < CLOSE_DEADLINE_S
        assert answers[0]["stopReason"] == "cancelled"
        assert lease.running_children == ()
        assert harness.runtime.lease_of(sid) is None
        # The child's turn ended with its parent's: it asked, and nothing ran.
        (child,) = await harness.runtime.store.children(sid)
        history = await harness.runtime.store.history(child.id)
        assert not [
            item
            for item in history
            if item.tool is not None and item.tool.status.value == "completed"
        ]


async def test_a_v2_resume_replays_each_child_after_its_announcement(
    harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, "/echo before\n/delegate A :: /echo from a\n/echo after")
        await wait_idle(client, sid)
        await client.call("session/close", {"sessionId": sid})
    async with v2_client(harness) as client:
        await client.call(
            "session/resume",
            {"sessionId": sid, "cwd": str(project), "replayFrom": {"type": "start"}},
        )
        order = session_ids_in_order(client)
        child = child_id_of(client, sid)
        announced = order.index((sid, "subagent_update"))
        child_frames = [i for i, (s, _) in enumerate(order) if s == child]
        assert announced < child_frames[0]
        # The child's replay ends with its own marker; the parent's comes last of all.
        assert order[child_frames[-1]] == (child, "replay_complete")
        assert order[-1] == (sid, "replay_complete")
        assert [t for k, _, t in client.messages(child) if k == "agent_message"] == ["from a"]
        parent_said = [t for k, _, t in client.messages(sid) if k == "agent_message"]
        assert parent_said[:1] == ["before"]
        # "before" precedes the child's transcript, "after" follows it.
        agent_frames = [i for i, (s, k) in enumerate(order) if s == sid and k == "agent_message"]
        assert agent_frames[0] < child_frames[0] < child_frames[-1] < agent_frames[-1]
        client.validate(ChildSessionsSchema(acp_schema_v2.directory))


async def test_a_replay_with_children_keeps_the_parents_images_and_only_its_last_plan(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    picture = base64.b64encode(png(2, 3)).decode()
    async with harness.connect() as writer:
        await writer.initialize(clientCapabilities={"subagents": {}})
        sid = (await writer.new_session(str(project)))["sessionId"]
        await writer.prompt(
            sid,
            [
                {"type": "text", "text": "/plan [x] one"},
                {"type": "image", "data": picture, "mimeType": "image/png"},
            ],
        )
        await writer.prompt(sid, "/delegate A :: /echo from a")
        await writer.prompt(sid, "/plan two")
        await writer.call("session/close", {"sessionId": sid})
    async with harness.connect() as client:
        await client.initialize(clientCapabilities={"subagents": {}})
        await client.load_session(sid, str(project))
        updates = client.updates(sid)
        images = [
            u["content"]
            for u in updates
            if u["sessionUpdate"] == "user_message_chunk" and u["content"]["type"] == "image"
        ]
        assert [image["data"] for image in images] == [picture]
        plans = [u["entries"] for u in updates if u["sessionUpdate"] == "plan"]
        assert plans == [[{"content": "two", "priority": "medium", "status": "pending"}]]
        assert client.text(child_id_of(client, sid)) == "from a"
        client.validate(ChildSessionsSchema(acp_schema.directory))


async def test_a_long_child_streams_a_bounded_number_of_bounded_frames_as_a_tool_call(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/delegate Long :: /stream 3000 10\n/echo done")
        call = next(u for u in client.updates(sid) if u.get("title") == "Long")["toolCallId"]
        streamed = [
            u["content"][0]["content"]["text"]
            for u in client.updates(sid)
            if u.get("toolCallId") == call and u.get("content")
        ]
        # 30,000 characters in 3,000 chunks: the text so far at most every 256 new ones,
        # never past the tool text bound, and the call ends with the child's (cut) answer.
        assert len(streamed) <= 16_000 // 256 + 3
        assert max(len(text) for text in streamed) <= 16_000
        assert streamed[-2].startswith("x" * 1000)
        client.validate(acp_schema)
