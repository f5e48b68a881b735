"""Every row of the protocol table, over the wire, with every frame checked against the schema."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.model import ToolState, ToolStatus
from maple_acp.runtime import ToolRequest, Turn
from maple_acp.testing.client import AcpTestClient, reject
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError


async def _error(call: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        await call
    error = info.value
    assert error.message
    assert "\n" not in error.message
    assert len(error.message) <= 500
    return error


def _kinds(client: AcpTestClient, sid: str) -> list[str]:
    return [u["sessionUpdate"] for u in client.updates(sid)]


# -- initialize -------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [0, 1, 2, 65535])
async def test_initialize_answers_version_one(
    harness: Harness, requested: int, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        result = await client.call(
            "initialize", {"protocolVersion": requested, "clientCapabilities": {}}
        )
        assert result["protocolVersion"] == 1
        caps = result["agentCapabilities"]
        assert caps["loadSession"] is True
        # The demo backend declares images and embedded text resources; never audio.
        assert caps["promptCapabilities"] == {
            "image": True,
            "audio": False,
            "embeddedContext": True,
        }
        assert caps["mcpCapabilities"] == {"http": True, "sse": False, "acp": True}
        # Deletion is host policy: off unless the host's config allows it.
        assert set(caps["sessionCapabilities"]) == {
            "list",
            "close",
            "resume",
            "additionalDirectories",
            "fork",
        }
        assert result.get("authMethods", []) == []
        assert result["agentInfo"]["name"]
        assert result["_meta"]["goal"] == {
            "version": 1,
            "controlMethod": "_session/goal",
            "actions": ["set", "pause", "resume", "clear"],
        }
        client.validate(acp_schema)


@pytest.mark.parametrize(
    "method",
    ["session/delete", "authenticate", "logout", "_other/x"],
)
async def test_unsupported_methods_are_not_found(harness: Harness, method: str) -> None:
    async with harness.connect() as client:
        error = await _error(client.call(method, {"sessionId": "x"}))
        assert error.code == -32601
        # The connection is still usable.
        assert (await client.initialize())["protocolVersion"] == 1


async def test_params_must_be_an_object(harness: Harness) -> None:
    async with harness.connect() as client:
        error = await _error(client.call("session/new", [1, 2]))
        assert error.code == -32602
        error = await _error(client.call("session/new", {"cwd": 5, "mcpServers": []}))
        assert error.code == -32602
        assert "cwd" in error.message


# -- session/new ------------------------------------------------------------------------------


async def test_new_session_result(harness: Harness, project: Path, acp_schema: AcpSchema) -> None:
    async with harness.connect() as client:
        await client.initialize()
        result = await client.new_session(str(project))
        assert result["modes"]["currentModeId"] == "code"
        assert [m["id"] for m in result["modes"]["availableModes"]] == [
            "ask",
            "code",
            "plan",
            "auto-edit",
        ]
        options = {o["id"]: o for o in result["configOptions"]}
        assert options["model"]["category"] == "model"
        assert options["model"]["currentValue"] == "demo-echo"
        assert [o["value"] for o in options["model"]["options"]] == ["demo-echo", "demo-echo-large"]
        assert options["mode"]["currentValue"] == "code"
        client.validate(acp_schema)


async def test_new_session_refusals(harness: Harness, project: Path, tmp_path: Path) -> None:
    async with harness.connect() as client:
        for params in (
            {"cwd": "relative/dir", "mcpServers": []},
            {"cwd": str(tmp_path / "missing"), "mcpServers": []},
            {"cwd": str(project), "mcpServers": [], "additionalDirectories": ["relative/dir"]},
            {
                "cwd": str(project),
                "mcpServers": [{"name": "x", "command": "/bin/true", "args": [], "env": []}],
            },
        ):
            error = await _error(client.call("session/new", params))
            assert error.code == -32602, params
        listing = await harness.runtime.list_tasks()
        assert listing.tasks == ()
        # Nothing was created, not even a hidden provisional task.
        assert await client.list_sessions() == {"sessions": []}


async def test_new_session_outside_allowed_roots(tmp_path: Path, project: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    config = AcpServiceConfig(allowed_roots=(str(allowed),))
    async with running_service(tmp_path, config=config) as running, running.connect() as client:
        error = await _error(client.new_session(str(project)))
        assert error.code == -32602
        inside = allowed / "repo"
        inside.mkdir()
        assert (await client.new_session(str(inside)))["sessionId"]


async def test_symlinked_cwd_is_canonicalised(
    harness: Harness, project: Path, tmp_path: Path
) -> None:
    link = tmp_path / "link"
    link.symlink_to(project)
    async with harness.connect() as client:
        sid = (await client.new_session(str(link)))["sessionId"]
        await client.prompt(sid, "hi")
        listed = await client.list_sessions()
        assert listed["sessions"][0]["cwd"] == str(project.resolve())


# -- session/prompt ---------------------------------------------------------------------------


async def test_prompt_streams_with_stable_message_ids(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "/stream 5 10\n/think pondering")
        assert answer["stopReason"] == "end_turn"
        chunks = [u for u in client.updates(sid) if u["sessionUpdate"] == "agent_message_chunk"]
        # Chunks queued together arrive joined: at most as many frames as were sent.
        assert 1 <= len(chunks) <= 5
        assert len({c["messageId"] for c in chunks}) == 1
        assert client.text(sid) == "x" * 50
        assert client.text(sid, "agent_thought_chunk") == "pondering"
        client.validate(acp_schema)


class TwoMessagesBackend:
    """Streams two messages back to back (no other event between them), then a thought."""

    async def run_turn(self, turn: Turn) -> None:
        first = turn.new_message_id()
        second = turn.new_message_id()
        for _ in range(100):
            await turn.send_text("x", message_id=first)
        for _ in range(100):
            await turn.send_text("y", message_id=second)
        await turn.send_thought("hmm")


async def test_chunks_queued_together_go_out_as_one_frame(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with (
        running_service(tmp_path, backend=TwoMessagesBackend()) as harness,
        harness.connect() as client,
    ):
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "go")
        assert answer["stopReason"] == "end_turn"
        chunks = [u for u in client.updates(sid) if u["sessionUpdate"] == "agent_message_chunk"]
        # The backend queues its chunks without waiting: the pump finds them together.
        assert len(chunks) < 200
        assert client.text(sid) == "x" * 100 + "y" * 100
        # Joined in order, never across messages (nor kinds).
        for update in chunks:
            text = update["content"]["text"]
            assert text == text[0] * len(text)
        assert len({c["messageId"] for c in chunks}) == 2
        assert client.text(sid, "agent_thought_chunk") == "hmm"
        client.validate(acp_schema)


async def test_text_blocks_joined_and_resource_link_is_visible_text(
    harness: Harness, project: Path
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(
            sid,
            [
                {"type": "text", "text": "first"},
                {"type": "resource_link", "name": "notes.md", "uri": "file:///tmp/notes.md"},
                {"type": "text", "text": "last"},
            ],
        )
        text = client.text(sid)
        assert text == "first\n\nnotes.md <file:///tmp/notes.md>\n\nlast"


@pytest.mark.parametrize(
    "block",
    [
        # Bytes that are no image, whatever the mimeType says.
        {"type": "image", "data": "aGk=", "mimeType": "image/png"},
        {"type": "audio", "data": "aGk=", "mimeType": "audio/wav"},
        {
            "type": "resource",
            "resource": {"uri": "file:///x.pdf", "blob": "aGk=", "mimeType": "application/pdf"},
        },
    ],
)
async def test_unsupported_blocks_refused_before_anything_is_admitted(
    harness: Harness, project: Path, block: dict[str, Any]
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        error = await _error(client.prompt(sid, [{"type": "text", "text": "hi"}, block]))
        assert error.code == -32602
        assert "prompt[1]" in error.message
        assert await harness.runtime.store.item_count(sid) == 0
        task = await harness.runtime.store.get_task(sid)
        assert task is not None
        assert task.provisional
        # The session is still usable.
        assert (await client.prompt(sid, "ok"))["stopReason"] == "end_turn"


async def test_prompt_unknown_session(harness: Harness) -> None:
    async with harness.connect() as client:
        error = await _error(client.prompt("nope", "hi"))
        assert error.code == -32002


async def test_one_prompt_at_a_time(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            first: dict[str, Any] = {}
            second: dict[str, Any] = {}

            async def hang() -> None:
                first.update(await client.prompt(sid, "/echo started\n/hang"))

            async def again() -> None:
                second.update(await client.prompt(sid, "/echo again"))

            nursery.start_soon(hang)
            await client.wait_until(lambda: client.text(sid) == "started")
            # The second prompt waits its turn in the queue: it never runs beside the first.
            nursery.start_soon(again)
            await client.wait_until(
                lambda: any(m.get("method") == "_session/queue_changed" for m in client.inbound())
            )
            assert client.text(sid) == "started"
            await client.cancel(sid)
        # The hung turn reported no usage: the answer carries none (zeros are not counts).
        assert first == {"stopReason": "cancelled"}
        # The cancel withdrew the waiting prompt too: it never ran.
        assert second == {"stopReason": "cancelled"}
        assert client.text(sid) == "started"


async def test_usage_is_per_turn(harness: Harness, project: Path, acp_schema: AcpSchema) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        one = await client.prompt(sid, "/usage 10 20")
        two = await client.prompt(sid, "/usage 1 2")
        assert one["usage"]["inputTokens"] == 10
        assert one["usage"]["outputTokens"] == 20
        assert one["usage"]["totalTokens"] == 30
        assert two["usage"]["inputTokens"] == 1
        assert two["usage"]["totalTokens"] == 3
        assert "cost" not in two["usage"]
        client.validate(acp_schema)


async def test_failed_turn_shows_its_text(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "/fail the model went away")
        assert answer["stopReason"] == "end_turn"
        assert "the model went away" in client.text(sid)


async def test_first_prompt_locks_the_model(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        result = await client.call(
            "session/set_config_option",
            {"sessionId": sid, "configId": "model", "value": "demo-echo-large"},
        )
        model = next(o for o in result["configOptions"] if o["id"] == "model")
        assert model["currentValue"] == "demo-echo-large"
        await client.prompt(sid, "hi")
        updates = [u for u in client.updates(sid) if u["sessionUpdate"] == "config_option_update"]
        assert len(updates) == 1
        locked = next(o for o in updates[0]["configOptions"] if o["id"] == "model")
        assert [o["value"] for o in locked["options"]] == ["demo-echo-large"]
        error = await _error(
            client.call(
                "session/set_config_option",
                {"sessionId": sid, "configId": "model", "value": "demo-echo"},
            )
        )
        assert error.code == -32602
        # The same model is still accepted.
        await client.call(
            "session/set_config_option",
            {"sessionId": sid, "configId": "model", "value": "demo-echo-large"},
        )
        await client.prompt(sid, "again")
        assert _kinds(client, sid).count("config_option_update") == 1
        client.validate(acp_schema)


async def test_config_and_mode_refusals(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        for params in (
            {"sessionId": sid, "configId": "model", "value": "demo-embed"},
            {"sessionId": sid, "configId": "model", "value": "no-such-model"},
            {"sessionId": sid, "configId": "mode", "value": "auto"},
            {"sessionId": sid, "configId": "temperature", "value": "hot"},
        ):
            error = await _error(client.call("session/set_config_option", params))
            assert error.code == -32602, params
        assert await client.call("session/set_mode", {"sessionId": sid, "modeId": "code"}) == {}
        error = await _error(client.call("session/set_mode", {"sessionId": sid, "modeId": "auto"}))
        assert error.code == -32602
        error = await _error(client.call("session/set_mode", {"sessionId": "x", "modeId": "x"}))
        assert error.code == -32002


# -- cancel -----------------------------------------------------------------------------------


async def test_cancel_answers_cancelled_after_every_update(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            answer: dict[str, Any] = {}

            async def run() -> None:
                answer.update(await client.prompt(sid, "/echo before\n/hang"))

            nursery.start_soon(run)
            await client.wait_until(lambda: client.text(sid) == "before")
            await client.cancel(sid)
        assert answer["stopReason"] == "cancelled"
        # The answer is the last frame about this session.
        inbound = client.inbound()
        response_at = max(
            i for i, m in enumerate(inbound) if "result" in m and m["result"] == answer
        )
        assert all(m.get("method") != "session/update" for m in inbound[response_at + 1 :])
        # The session is usable after a cancel.
        assert (await client.prompt(sid, "/echo after"))["stopReason"] == "end_turn"
        client.validate(acp_schema)


async def test_cancel_unknown_session_is_a_silent_no_op(harness: Harness) -> None:
    async with harness.connect() as client:
        await client.cancel("no-such-session")
        await client.notify("session/cancel", {"bogus": True})
        assert (await client.initialize())["protocolVersion"] == 1
        assert [m for m in client.inbound() if "error" in m] == []


async def test_cancel_request_cancels_the_handler(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.send_raw(
            b'{"jsonrpc":"2.0","id":"p1","method":"session/prompt","params":{"sessionId":"'
            + sid.encode()
            + b'","prompt":[{"type":"text","text":"/echo started\\n/hang"}]}}'
        )
        await client.wait_until(lambda: client.text(sid) == "started")
        await client.notify("$/cancel_request", {"requestId": "p1"})
        await client.wait_until(lambda: any(m.get("id") == "p1" for m in client.inbound()))
        answer = next(m for m in client.inbound() if m.get("id") == "p1")
        assert answer["error"]["code"] == -32800
        # The run was cancelled with the handler: the session takes a new prompt.
        assert (await client.prompt(sid, "/echo next"))["stopReason"] == "end_turn"


# -- close ------------------------------------------------------------------------------------


async def test_close_deletes_only_an_untouched_provisional_task(
    harness: Harness, project: Path
) -> None:
    store = harness.runtime.store
    async with harness.connect() as client:
        fresh = (await client.new_session(str(project)))["sessionId"]
        prompted = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(prompted, "keep me")
        assert await client.close_session(fresh) == {}
        assert await client.close_session(prompted) == {}
        assert await store.get_task(fresh) is None
        assert await store.get_task(prompted) is not None
        # A second close, and any later use, of a closed session: not owned any more.
        assert (await _error(client.close_session(prompted))).code == -32002
        assert (await _error(client.prompt(prompted, "hi"))).code == -32002


async def test_close_cancels_a_running_prompt(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            answer: dict[str, Any] = {}

            async def run() -> None:
                answer.update(await client.prompt(sid, "/echo started\n/hang"))

            nursery.start_soon(run)
            await client.wait_until(lambda: client.text(sid) == "started")
            assert await client.close_session(sid) == {}
        assert answer["stopReason"] == "cancelled"
        assert harness.runtime.lease_of(sid) is None
        assert harness.runtime.status().active_runs == 0


async def test_durable_task_survives_close_and_loads_again(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, '/echo one\n/think hmm\n/tool shell {"command": "echo out"}')
        await client.close_session(sid)
    async with harness.connect() as client:
        result = await client.load_session(sid, str(project))
        assert result["modes"]["currentModeId"] == "code"
        kinds = _kinds(client, sid)
        assert kinds[0] == "user_message_chunk"
        assert "agent_message_chunk" in kinds
        assert "agent_thought_chunk" in kinds
        tool = next(u for u in client.updates(sid) if u["sessionUpdate"] == "tool_call")
        assert tool["status"] == "completed"
        # The terminal output is preferred over the request summary; raw input is kept.
        assert "out" in tool["content"][0]["content"]["text"]
        assert tool["rawInput"] == {"command": "echo out"}
        # Replay came before the answer.
        inbound = client.inbound()
        answer_at = next(i for i, m in enumerate(inbound) if m.get("result") == result)
        assert all(inbound[i].get("method") == "session/update" for i in range(answer_at))
        assert (await client.prompt(sid, "/echo more"))["stopReason"] == "end_turn"
        client.validate(acp_schema)


# -- load -------------------------------------------------------------------------------------


async def test_load_refusals(harness: Harness, project: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    async with harness.connect() as first, harness.connect() as second:
        sid = (await first.new_session(str(project)))["sessionId"]
        await first.prompt(sid, "hello")
        # A re-load on the connection that holds the session is a re-attach (issue 10).
        await first.load_session(sid, str(project))
        assert (await _error(second.load_session(sid, str(project)))).code == -32600
        assert (await _error(second.load_session("missing", str(project)))).code == -32002
        await first.close_session(sid)
        assert (await _error(second.load_session(sid, str(other)))).code == -32602
        assert (await _error(second.load_session(sid, "relative"))).code == -32602
        await second.load_session(sid, str(project))


async def test_load_refuses_a_task_with_a_running_prompt(harness: Harness, project: Path) -> None:
    async with harness.connect() as first, harness.connect() as second:
        sid = (await first.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.prompt, sid, "/echo started\n/hang")
            await first.wait_until(lambda: first.text(sid) == "started")
            error = await _error(second.load_session(sid, str(project)))
            assert error.code == -32600
            await first.cancel(sid)


# -- list -------------------------------------------------------------------------------------


async def test_list_pages_filters_and_hides_provisional(
    harness: Harness, project: Path, tmp_path: Path, acp_schema: AcpSchema
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with harness.connect() as client:
        assert await client.list_sessions() == {"sessions": []}
        prompted = []
        for i in range(3):
            sid = (await client.new_session(str(project)))["sessionId"]
            await client.prompt(sid, f"task {i}")
            prompted.append(sid)
        hidden = (await client.new_session(str(project)))["sessionId"]
        other = (await client.new_session(str(elsewhere)))["sessionId"]
        await client.prompt(other, "elsewhere")
        listed = await client.list_sessions()
        ids = [s["sessionId"] for s in listed["sessions"]]
        assert hidden not in ids
        assert ids[:3] == [other, *reversed(prompted)][:3]
        only = await client.list_sessions(cwd=str(project))
        assert [s["sessionId"] for s in only["sessions"]] == list(reversed(prompted))
        assert all(s["cwd"] == str(project) for s in only["sessions"])
        error = await _error(client.list_sessions(cursor="garbage"))
        assert error.code == -32602
        client.validate(acp_schema)


async def test_list_pages_of_at_most_100(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        for i in range(103):
            sid = (await client.new_session(str(project)))["sessionId"]
            await client.prompt(sid, f"{i}")
            await client.close_session(sid)
        first = await client.list_sessions()
        assert len(first["sessions"]) == 100
        second = await client.list_sessions(cursor=first["nextCursor"])
        assert len(second["sessions"]) == 3
        assert "nextCursor" not in second
        ids = [s["sessionId"] for s in first["sessions"] + second["sessions"]]
        assert len(set(ids)) == 103


# -- permissions ------------------------------------------------------------------------------


async def test_tool_permission_allow_runs_the_tool(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    marker = project / "ran"
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
        assert marker.exists()
        [request] = client.permission_requests
        assert [o["optionId"] for o in request["options"]] == ["allow_once", "reject_once"]
        assert [o["kind"] for o in request["options"]] == ["allow_once", "reject_once"]
        tools = [u for u in client.updates(sid) if u["sessionUpdate"].startswith("tool_call")]
        assert tools[0]["sessionUpdate"] == "tool_call"
        assert all(u["sessionUpdate"] == "tool_call_update" for u in tools[1:])
        assert tools[0]["kind"] == "execute"
        assert tools[-1]["status"] == "completed"
        client.validate(acp_schema)


async def test_tool_permission_reject_does_not_run(harness: Harness, project: Path) -> None:
    marker = project / "ran"
    async with harness.connect(permission=reject) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
        assert answer["stopReason"] == "end_turn"
        assert not marker.exists()
        tools = [u for u in client.updates(sid) if u["sessionUpdate"].startswith("tool_call")]
        assert tools[-1]["status"] == "failed"


@pytest.mark.parametrize(
    "answer",
    [
        "cancel",
        {"outcome": {"outcome": "selected", "optionId": "allow_always"}},
        {"outcome": {"outcome": "selected"}},
        {"outcome": "yes"},
        {},
        None,
        [1],
    ],
)
async def test_bad_permission_answers_fail_closed(
    harness: Harness, project: Path, answer: Any
) -> None:
    marker = project / "ran"
    async with harness.connect(permission=lambda params: answer) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        result = await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
        assert result["stopReason"] == "cancelled"
        assert not marker.exists()
        # The connection and the session stay usable.
        assert (await client.prompt(sid, "/echo fine"))["stopReason"] == "end_turn"


async def test_permission_error_answer_fails_closed(harness: Harness, project: Path) -> None:
    marker = project / "ran"

    def refuse(params: Any) -> Any:
        raise ProtocolError(-32603, "client broke")

    async with harness.connect(permission=refuse) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        result = await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
        assert result["stopReason"] == "cancelled"
        assert not marker.exists()


async def test_cancel_while_permission_pending_denies(harness: Harness, project: Path) -> None:
    marker = project / "ran"
    asked = trio.Event()
    release = trio.Event()

    async def slow(params: Any) -> str:
        asked.set()
        await release.wait()
        return "allow"

    async with harness.connect(permission=slow) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            answer: dict[str, Any] = {}
            answered = trio.Event()

            async def run() -> None:
                answer.update(
                    await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
                )
                answered.set()

            nursery.start_soon(run)
            await asked.wait()
            await client.cancel(sid)
            await answered.wait()
            # The late allow is too late: nothing runs.
            release.set()
        assert answer["stopReason"] == "cancelled"
        await trio.testing.wait_all_tasks_blocked()
        assert not marker.exists()


# -- goals ------------------------------------------------------------------------------------


async def test_goal_control_and_snapshots(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "start")

        def goals() -> list[Any]:
            return [
                u["_meta"]["goal"]
                for u in client.updates(sid)
                if u["sessionUpdate"] == "session_info_update" and "goal" in u.get("_meta", {})
            ]

        call = {"sessionId": sid, "action": "set", "objective": "  ship it hang  "}
        assert await client.call("_session/goal", call) == {}
        await client.wait_until(lambda: bool(goals()))
        snapshot = goals()[0]
        assert snapshot["objective"] == "ship it hang"
        assert snapshot["status"] == "active"
        assert snapshot["controlMethod"] == "_session/goal"
        assert isinstance(snapshot["createdAt"], int)
        assert await client.call("_session/goal", {"sessionId": sid, "action": "pause"}) == {}
        await client.wait_until(
            lambda: goals()[-1] is not None and goals()[-1]["status"] == "paused"
        )
        assert await client.call("_session/goal", {"sessionId": sid, "action": "resume"}) == {}
        await client.wait_until(
            lambda: goals()[-1] is not None and goals()[-1]["status"] == "active"
        )
        assert await client.call("_session/goal", {"sessionId": sid, "action": "clear"}) == {}
        await client.wait_until(lambda: goals()[-1] is None)
        client.validate(acp_schema)


async def test_goal_refusals(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        for params in (
            {"sessionId": sid, "action": "set", "objective": "   "},
            {"sessionId": sid, "action": "set"},
            {"sessionId": sid, "action": "explode"},
            {"sessionId": "unknown", "action": "clear"},
        ):
            error = await _error(client.call("_session/goal", params))
            assert error.code == -32602, params


async def test_goal_cycles_publish_outside_prompts(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/goal tidy up complete after 2")
        await client.wait_until(
            lambda: any(
                u["sessionUpdate"] == "session_info_update"
                and (u.get("_meta", {}).get("goal") or {}).get("status") == "complete"
                for u in client.updates(sid)
            )
        )
        assert "goal cycle 1: tidy up complete after 2" in client.text(sid)
        assert "goal cycle 2: tidy up complete after 2" in client.text(sid)


# -- bridge hello -----------------------------------------------------------------------------


async def test_hello_first_frame_reaches_the_shell(harness: Harness, project: Path) -> None:
    out = project / "env"
    async with harness.connect() as client:
        await client.notify(
            "_maple/bridge/hello",
            {"environment": {"RELAY_TOKEN": "relay-value-1", "NOT_ALLOWED": "x"}},
        )
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, f'/tool shell {{"command": "echo $RELAY_TOKEN > {out}"}}')
    assert out.read_text().strip() == "relay-value-1"


async def test_hello_after_other_traffic_is_ignored(harness: Harness, project: Path) -> None:
    out = project / "env"
    async with harness.connect() as client:
        await client.initialize()
        await client.notify("_maple/bridge/hello", {"environment": {"RELAY_TOKEN": "late"}})
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, f'/tool shell {{"command": "echo x$RELAY_TOKEN > {out}"}}')
    assert out.read_text().strip() == "x" + os.environ.get("RELAY_TOKEN", "")


# -- malformed input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"{not json", -32700),
        (b"[]", -32600),
        (b'[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', -32600),
        (b'{"jsonrpc":"1.0","id":1,"method":"initialize"}', -32600),
        (b'{"id":1,"method":"initialize"}', -32600),
        (b"42", -32600),
    ],
)
async def test_malformed_frames_answered_and_connection_usable(
    harness: Harness, line: bytes, code: int
) -> None:
    async with harness.connect() as client:
        await client.send_raw(line)
        await client.wait_until(lambda: any("error" in m for m in client.inbound()))
        error = next(m for m in client.inbound() if "error" in m)
        assert error["error"]["code"] == code
        assert (await client.initialize())["protocolVersion"] == 1


async def test_cancel_right_behind_the_prompt_ends_it(harness: Harness, project: Path) -> None:
    """Regression: a cancel that arrives before the prompt's run exists (the prompt's task
    has not even started) must still end that prompt."""
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        prompt = (
            b'{"jsonrpc":"2.0","id":"p","method":"session/prompt","params":{"sessionId":"'
            + sid.encode()
            + b'","prompt":[{"type":"text","text":"/hang"}]}}'
        )
        cancel = (
            b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"'
            + sid.encode()
            + b'"}}'
        )
        # No checkpoint between the two: the client's writer sends both in one write, so the
        # service reads them together and the prompt's task has not started at the cancel.
        await client.send_raw(prompt)
        await client.send_raw(cancel)
        await client.wait_until(lambda: any(m.get("id") == "p" for m in client.inbound()))
        answer = next(m for m in client.inbound() if m.get("id") == "p")
        assert answer["result"]["stopReason"] == "cancelled"
        # Nothing was admitted for a turn cancelled before its run existed.
        assert await harness.runtime.store.item_count(sid) == 0


class _AskFirstBackend:
    """Asks permission for a tool before reporting any row of it."""

    async def run_turn(self, turn: Turn) -> None:
        allowed = await turn.ask_permission(ToolRequest(tool_id="t1", name="shell", title="run"))
        status = ToolStatus.COMPLETED if allowed else ToolStatus.FAILED
        await turn.send_tool_row(
            "t1", ToolState(name="shell", status=status, title="run", output_text="done")
        )


async def test_permission_before_any_row_still_announces_the_tool_call(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with (
        running_service(tmp_path, backend=_AskFirstBackend()) as running,
        running.connect() as client,
    ):
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "go"))["stopReason"] == "end_turn"
        [request] = client.permission_requests
        assert request["toolCall"]["toolCallId"] == "t1"
        [row] = [u for u in client.updates(sid) if u["sessionUpdate"].startswith("tool_call")]
        assert row["sessionUpdate"] == "tool_call"
        assert row["status"] == "completed"
        client.validate(acp_schema)


@pytest.mark.parametrize("order", ["cancel-then-answer", "answer-then-cancel"])
async def test_cancel_while_permission_pending_marks_the_tool_row_cancelled(
    harness: Harness, project: Path, order: str
) -> None:
    """An ACP client cancels a turn by sending ``session/cancel`` and answering the open
    permission question ``cancelled`` (in either order): nobody said no, so the tool row ends
    "cancelled", not "permission denied" (ACP v1 has no cancelled status: the row's status is
    ``failed``, its text says why)."""
    asked = trio.Event()
    release = trio.Event()

    async def cancelling(params: Any) -> str:
        asked.set()
        await release.wait()
        return "cancel"

    async with harness.connect(permission=cancelling) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            answer: dict[str, Any] = {}

            async def run() -> None:
                answer.update(await client.prompt(sid, '/tool shell {"command": "true"}'))

            nursery.start_soon(run)
            await asked.wait()
            if order == "cancel-then-answer":
                await client.cancel(sid)
                await trio.testing.wait_all_tasks_blocked()
                release.set()
            else:
                release.set()
                await trio.testing.wait_all_tasks_blocked()
                await client.cancel(sid)
        assert answer["stopReason"] == "cancelled"
        rows = [u for u in client.updates(sid) if u["sessionUpdate"].startswith("tool_call")]
        assert rows[-1]["status"] == "failed"
        assert rows[-1]["content"] == [
            {"type": "content", "content": {"type": "text", "text": "cancelled"}}
        ]
        assert "permission denied" not in json.dumps(rows)
