"""A child session with a real model: the local model is offered ``delegate``, and one call
of it is forced (the proxy adds ``tool_choice`` naming it to the parent's first request; the
engine never sends one), so the host's whole delegation path runs against a real server: the
child's own request (without ``delegate``), its answer streamed under its own session, the
parent's next request carrying that answer as the call's result, and the turns after it.

What the model writes is not checked, only where it goes: a 135M model may fill the call's
arguments with anything, and the host must take whatever it gets.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
import trio
from e2e.host_processes import MAPLE_ACP, Connector, Host, connector_client, private_short_dir

from maple_acp.runtime._children import EMPTY_ANSWER
from maple_acp.testing.schema import OUTBOUND_DEFINITIONS, AcpSchema

from .conftest import FIGURES
from .recording_proxy import Exchange, RecordingProxy
from .test_local_model import (
    DEADLINE,
    NO_END,
    assert_answered,
    assert_prefix_kept,
    live_host,
    timed_prompt,
)

pytestmark = pytest.mark.deadline(DEADLINE + 120)
DELEGATE: Final = "delegate"
FORCE_DELEGATE: Final = {"tool_choice": {"type": "function", "function": {"name": DELEGATE}}}
#: The update kinds only v1's unstable schema defines.
CHILD_KINDS: Final = frozenset({"subagent_update", "session_message"})
PROMPT: Final = (
    'Hand this task to a child session titled "Greeting": say hello in one short sentence.'
)


class ChildSessionsSchema(AcpSchema):
    """v1's schema, reading the child shapes from its unstable file (the only one that has
    them)."""

    def validate_outbound(self, method: str, params: Any) -> None:
        kind = params.get("update", {}).get("sessionUpdate") if method == "session/update" else None
        if kind not in CHILD_KINDS:
            super().validate_outbound(method, params)
            return
        self.validate(OUTBOUND_DEFINITIONS[method], params, unstable=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with private_short_dir("macp-ld-") as path:
        yield path


@asynccontextmanager
async def acp_with_children(host: Host) -> AsyncIterator[Connector]:
    """``maple-acp acp`` bridged to ``host``, initialized as a v1 client that shows child
    sessions (``clientCapabilities.subagents``)."""
    async with connector_client(host.socket, command=[*MAPLE_ACP, "acp"]) as bridge:
        await bridge.client.initialize(clientCapabilities={"subagents": {}})
        yield bridge


def tool_names(exchange: Exchange) -> list[str]:
    return [tool["function"]["name"] for tool in exchange.json().get("tools") or ()]


def streamed_calls(exchange: Exchange) -> list[tuple[str, str]]:
    """The tool calls the server streamed: (name, arguments as JSON text), in order."""
    calls: dict[int, list[str]] = {}
    for payload in exchange.payloads():
        for choice in payload.get("choices") or ():
            for fragment in (choice.get("delta") or {}).get("tool_calls") or ():
                call = calls.setdefault(fragment.get("index", 0), ["", ""])
                function = fragment.get("function") or {}
                # llama.cpp's server repeats the name in every fragment: the first one names it.
                call[0] = call[0] or function.get("name") or ""
                call[1] += function.get("arguments") or ""
    return [(name, arguments) for name, arguments in calls.values()]


def streamed_text(exchange: Exchange) -> str:
    return "".join(
        (choice.get("delta") or {}).get("content") or ""
        for payload in exchange.payloads()
        for choice in payload.get("choices") or ()
    )


async def test_a_forced_delegate_call_runs_a_child_session_against_the_server(
    short_dir: Path, proxy: RecordingProxy, acp_schema: AcpSchema
) -> None:
    project = short_dir / "project"
    project.mkdir()
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp_with_children(host) as bridge:
            client = bridge.client
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            proxy.force_next(**FORCE_DELEGATE)
            turn = await timed_prompt(client, sid, PROMPT)
            after = await timed_prompt(client, sid, "Thank you. Say goodbye.")
            client.validate(ChildSessionsSchema(acp_schema.directory))
            log = host.stderr.text
    chats = proxy.chats()
    FIGURES["delegation: requests (parent, child, parent, next turn)"] = len(chats)
    assert len(chats) == 4, [(tool_names(c), c.forced) for c in chats]
    call, child, follow_up, later = chats
    for exchange in chats:
        assert_answered(exchange)
    # The parent was offered delegate and, forced, called it.
    assert DELEGATE in tool_names(call)
    assert call.forced == FORCE_DELEGATE
    assert call.finish_reasons() == ["tool_calls"]
    [(name, arguments)] = streamed_calls(call)
    assert name == DELEGATE
    asked = orjson.loads(arguments)
    FIGURES["delegation: the model's arguments"] = arguments
    # The child's request: its own conversation (the delegation prompt, none of the
    # parent's), the same model, nothing forced, and no delegate tool.
    assert child.forced == {}
    assert DELEGATE not in tool_names(child)
    assert tool_names(child), "the child is offered the other tools"
    assert child.json()["model"] == call.json()["model"]
    child_messages = child.json()["messages"]
    assert child_messages[-1] == {"role": "user", "content": asked["prompt"]}
    assert PROMPT not in orjson.dumps(child_messages).decode()
    # On the wire: the child announced, then its answer under its own session id.
    announced = [u for u in client.updates(sid) if u["sessionUpdate"] == "subagent_update"]
    child_id = announced[0]["sessionId"]
    assert child_id != sid
    assert announced[0]["title"] == asked["title"].strip()
    answer = streamed_text(child)
    assert client.text(child_id) == answer
    assert [u["state"] for u in announced if "state" in u][-1] == {
        "state": "idle",
        "stopReason": "end_turn",
    }
    messages = [u for u in client.updates(sid) if u["sessionUpdate"] == "session_message"]
    assert [(m["senderSessionId"], m["recipientSessionId"]) for m in messages] == [
        (sid, child_id),
        (child_id, sid),
    ]
    assert messages[0]["content"] == [{"type": "text", "text": asked["prompt"]}]
    # The parent's next request: the call and the child's answer as its result.
    roles = [m["role"] for m in follow_up.json()["messages"]]
    assert roles[-2:] == ["assistant", "tool"]
    result = follow_up.json()["messages"][-1]["content"]
    assert result == (answer if answer.strip() else EMPTY_ANSWER)
    assert messages[1]["content"] == [{"type": "text", "text": result}]
    assert DELEGATE in tool_names(follow_up)
    assert follow_up.forced == {}
    assert_prefix_kept(call, follow_up)
    # Both turns ended well, and the next one carries the delegation as it was sent.
    assert turn.answer["stopReason"] == "end_turn"
    assert not turn.notices, turn.notices
    assert after.answer["stopReason"] == "end_turn"
    assert_prefix_kept(follow_up, later)
    assert "Traceback" not in log
    assert not [p for p in project.rglob("*") if p.is_file()]


async def test_cancelling_the_parent_mid_child_ends_the_childs_request_and_the_next_turn_runs(
    short_dir: Path, proxy: RecordingProxy, acp_schema: AcpSchema
) -> None:
    project = short_dir / "project"
    project.mkdir()
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp_with_children(host) as bridge:
            client = bridge.client
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            proxy.force_next(**FORCE_DELEGATE)
            answers: list[Any] = []
            async with trio.open_nursery() as nursery:

                async def prompt() -> None:
                    answers.append(await client.prompt(sid, PROMPT))

                nursery.start_soon(prompt)
                await proxy.wait_until(lambda: len(proxy.chats()) == 1)
                # The child's request, whenever it comes, is a long one.
                proxy.force_next(max_tokens=1000, **NO_END)
                await client.wait_until(
                    lambda: bool(
                        [u for u in client.updates(sid) if u["sessionUpdate"] == "subagent_update"]
                    )
                )
                announced = [
                    u for u in client.updates(sid) if u["sessionUpdate"] == "subagent_update"
                ]
                child_id = announced[0]["sessionId"]
                await client.wait_until(lambda: len(client.text(child_id)) >= 20)
                child = proxy.chats()[1]
                assert not child.ended
                cancelled_at = trio.current_time()
                await client.cancel(sid)
            answered_in = trio.current_time() - cancelled_at
            await proxy.wait_until(lambda: child.closed_at is not None)
            after = await timed_prompt(client, sid, "Say hello.")
            client.validate(ChildSessionsSchema(acp_schema.directory))
            log = host.stderr.text
    assert answers[0]["stopReason"] == "cancelled"
    assert answered_in < 2.0
    # The child's request was cut by the host, not answered to its end.
    assert child.forced == {"max_tokens": 1000, **NO_END}
    assert DELEGATE not in tool_names(child)
    assert child.cut_by_client
    assert not child.ended
    states = [
        u["state"]
        for u in client.updates(sid)
        if u["sessionUpdate"] == "subagent_update" and u["sessionId"] == child_id and "state" in u
    ]
    assert states[-1] == {"state": "idle", "stopReason": "cancelled"}
    # The parent's turn sent nothing more to the server; the next turn is answered.
    assert len(proxy.chats()) == 3
    assert after.answer["stopReason"] == "end_turn"
    assert_answered(proxy.chats()[-1])
    assert "Traceback" not in log
    FIGURES["delegation: a parent's cancel answered in (s)"] = f"{answered_in:.2f}"
