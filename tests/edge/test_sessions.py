"""Re-load on the same connection, session/resume, session/delete and the input rules every
method shares, over the wire; every frame validates against the ACP schema."""

from __future__ import annotations

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


async def _error(call: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        await call
    error = info.value
    assert error.message
    assert "\n" not in error.message
    assert len(error.message) <= 500
    return error


def _replayed(client: AcpTestClient, sid: str) -> list[tuple[str, str]]:
    """(kind, text) of every message chunk the client saw for ``sid``."""
    return [
        (u["sessionUpdate"], u["content"]["text"])
        for u in client.updates(sid)
        if u["sessionUpdate"].endswith("_message_chunk")
    ]


# -- re-load ---------------------------------------------------------------------------------


async def test_reload_on_the_holding_connection_replays_again_and_answers_as_a_first_load(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as first, harness.connect() as other:
        sid = (await first.new_session(str(project)))["sessionId"]
        await first.prompt(sid, "/echo one")
        await first.close_session(sid)
        loaded = await other.load_session(sid, str(project))
        once = _replayed(other, sid)
        assert once == [("user_message_chunk", "/echo one"), ("agent_message_chunk", "one")]
        again = await other.load_session(sid, str(project))
        assert again == loaded
        assert _replayed(other, sid) == once + once
        # The replay came before the answer, both times.
        answers = [
            i
            for i, f in enumerate(other.frames)
            if f.direction == "in" and isinstance(f.message, dict) and "result" in f.message
        ]
        chunks = [
            i
            for i, f in enumerate(other.frames)
            if f.direction == "in"
            and isinstance(f.message, dict)
            and f.message.get("method") == "session/update"
            and f.message["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        ]
        assert len(chunks) == 2
        assert chunks[0] < answers[-2] < chunks[1] < answers[-1]
        # Still one lease, still usable.
        assert harness.runtime.status().leases == 1
        assert (await other.prompt(sid, "/echo two"))["stopReason"] == "end_turn"
        first.validate(acp_schema)
        other.validate(acp_schema)


async def test_reload_or_resume_while_a_prompt_runs_is_a_state_conflict(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client, harness.connect() as second:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.prompt, sid, "/echo started\n/hang")
            await client.wait_until(lambda: client.text(sid) == "started")
            assert (await _error(client.load_session(sid, str(project)))).code == -32600
            assert (await _error(client.resume_session(sid, str(project)))).code == -32600
            # Another connection cannot take it either.
            assert (await _error(second.load_session(sid, str(project)))).code == -32600
            await client.cancel(sid)
        await client.load_session(sid, str(project))
        assert (await _error(second.resume_session(sid, str(project)))).code == -32600
        client.validate(acp_schema)
        second.validate(acp_schema)


async def test_reload_in_another_directory_is_refused_and_keeps_the_session(
    harness: Harness, project: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await _error(client.load_session(sid, str(other)))).code == -32602
        assert (await client.prompt(sid, "/echo here"))["stopReason"] == "end_turn"


# -- resume ----------------------------------------------------------------------------------


async def test_resume_is_a_load_without_the_replay(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as first:
        init = first.frames[1].message["result"]
        assert init["agentCapabilities"]["sessionCapabilities"]["resume"] == {}
        sid = (await first.new_session(str(project)))["sessionId"]
        await first.prompt(sid, "/echo before")
    async with harness.connect() as client:
        answer = await client.resume_session(sid, str(project))
        assert answer["modes"]["currentModeId"] == "code"
        assert {o["id"] for o in answer["configOptions"]} == {"model", "mode"}
        assert _replayed(client, sid) == []
        assert (await client.prompt(sid, "/echo after"))["stopReason"] == "end_turn"
        assert client.text(sid) == "after"
        # The same admission rules as a load.
        assert (await _error(client.resume_session("f" * 32, str(project)))).code == -32002
        assert (await _error(client.resume_session(sid, "relative"))).code == -32602
        client.validate(acp_schema)


# -- delete ----------------------------------------------------------------------------------


async def test_delete_is_advertised_and_served_only_when_the_host_allows_it(
    tmp_path: Path, project: Path
) -> None:
    async with running_service(tmp_path) as harness, harness.connect() as client:
        caps = (await client.initialize())["agentCapabilities"]["sessionCapabilities"]
        assert "delete" not in caps
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await _error(client.delete_session(sid))).code == -32601


@pytest.fixture
async def deleting(tmp_path: Path) -> Any:
    config = AcpServiceConfig(allow_session_delete=True)
    async with running_service(tmp_path, config=config) as harness:
        yield harness


async def test_delete_removes_a_task_for_good(
    deleting: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with deleting.connect() as client:
        caps = (await client.initialize())["agentCapabilities"]["sessionCapabilities"]
        assert caps["delete"] == {}
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo doomed")
        kept = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(kept, "/echo kept")
        await client.close_session(sid)
        assert await client.delete_session(sid) == {}
        listed = [s["sessionId"] for s in (await client.list_sessions())["sessions"]]
        assert listed == [kept]
        assert (await _error(client.load_session(sid, str(project)))).code == -32002
        assert (await _error(client.resume_session(sid, str(project)))).code == -32002
        client.validate(acp_schema)
    assert await deleting.runtime.store.get_task(sid) is None
    assert await deleting.runtime.store.history(sid) == []


async def test_delete_is_idempotent_and_no_existence_oracle(
    deleting: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    """Unknown, already deleted and another account's ids all answer ``{}``; the other
    account's task stays."""
    async with deleting.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo twice")
        assert await client.delete_session(sid) == {}
        assert await client.delete_session(sid) == {}
        assert await client.delete_session("f" * 32) == {}
        theirs = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(theirs, "/echo theirs")
        await client.close_session(theirs)
        client.validate(acp_schema)
    deleting.runtime.sign_in("someone-else")
    async with deleting.connect() as client:
        await client.initialize()
        assert await client.delete_session(theirs) == {}
        assert (await _error(client.load_session(theirs, str(project)))).code == -32002
        client.validate(acp_schema)
    assert await deleting.runtime.store.get_task(theirs) is not None


async def test_delete_of_a_held_session_closes_it_first_and_sends_nothing_after(
    deleting: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with deleting.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo mine")
        assert await client.delete_session(sid) == {}
        assert deleting.runtime.status().leases == 0
        assert (await _error(client.prompt(sid, "/echo again"))).code == -32002
        answer_at = max(
            i
            for i, f in enumerate(client.frames)
            if f.direction == "in" and isinstance(f.message, dict) and "result" in f.message
        )
        later = [
            f.message
            for f in client.frames[answer_at:]
            if f.direction == "in"
            and isinstance(f.message, dict)
            and f.message.get("params", {}).get("sessionId") == sid
        ]
        assert later == []
        # A never-prompted task of this connection goes as well (its close already took it).
        fresh = (await client.new_session(str(project)))["sessionId"]
        assert await client.delete_session(fresh) == {}
        assert await deleting.runtime.store.get_task(fresh) is None
        client.validate(acp_schema)


async def test_delete_refuses_a_task_another_connection_holds_or_a_running_one(
    deleting: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with deleting.connect() as owner, deleting.connect() as other:
        sid = (await owner.new_session(str(project)))["sessionId"]
        await owner.prompt(sid, "/echo held")
        assert (await _error(other.delete_session(sid))).code == -32600
        async with trio.open_nursery() as nursery:
            nursery.start_soon(owner.prompt, sid, "/echo started\n/hang")
            await owner.wait_until(lambda: owner.text(sid).endswith("started"))
            assert (await _error(owner.delete_session(sid))).code == -32600
            await owner.cancel(sid)
        assert await deleting.runtime.store.get_task(sid) is not None
        assert await owner.delete_session(sid) == {}
        owner.validate(acp_schema)
        other.validate(acp_schema)


async def test_a_deleted_task_stays_gone_after_a_restart(tmp_path: Path, project: Path) -> None:
    config = AcpServiceConfig(allow_session_delete=True)
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo once")
        await client.close_session(sid)
        await client.delete_session(sid)
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        assert (await client.list_sessions())["sessions"] == []
        assert (await _error(client.load_session(sid, str(project)))).code == -32002


# -- the shared input rules --------------------------------------------------------------------


async def test_a_session_id_is_trimmed_and_a_blank_one_is_bad_params(
    deleting: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with deleting.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        padded = f"  {sid}\t"
        assert (await client.prompt(padded, "/echo trimmed"))["stopReason"] == "end_turn"
        await client.call(
            "session/set_config_option",
            {"sessionId": padded, "configId": "mode", "value": "code"},
        )
        await client.load_session(padded, str(project))
        for blank in ("", "   ", "\t\n"):
            calls = [
                client.prompt(blank, "/echo x"),
                client.load_session(blank, str(project)),
                client.resume_session(blank, str(project)),
                client.close_session(blank),
                client.delete_session(blank),
                client.call("session/set_mode", {"sessionId": blank, "modeId": "code"}),
                client.call("_session/goal", {"sessionId": blank, "action": "clear"}),
            ]
            for call in calls:
                assert (await _error(call)).code == -32602
        await client.close_session(padded)
        client.validate(acp_schema)


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image", "data": "AAAA", "mimeType": "image/png"},
        {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
        {"type": "resource", "resource": {"uri": "file:///x", "blob": "AAAA"}},
    ],
)
async def test_refused_blocks_are_bad_params_even_for_an_unknown_session(
    harness: Harness, block: dict[str, Any]
) -> None:
    async with harness.connect() as client:
        error = await _error(client.prompt("f" * 32, [block]))
        assert error.code == -32602


@pytest.mark.parametrize(
    "raw_id", ["18446744073709551616", "-9223372036854775809", "99999999999999999999999999"]
)
async def test_an_integer_id_beyond_64_bits_is_echoed_exactly(
    harness: Harness, raw_id: str
) -> None:
    async with harness.connect() as client:
        line = b'{"jsonrpc":"2.0","id":' + raw_id.encode() + b',"method":"session/list"}\n'
        await client.send_raw(line)
        marker = b'"id":' + raw_id.encode() + b","

        def answered() -> bool:
            return any(f.direction == "in" and marker in f.raw for f in client.frames)

        await client.wait_until(answered)
        frame = next(f for f in client.frames if f.direction == "in" and marker in f.raw)
        assert orjson.loads(frame.raw)["result"] == {"sessions": []}


async def test_a_fractional_id_is_an_invalid_request(harness: Harness) -> None:
    async with harness.connect() as client:
        await client.send_raw(b'{"jsonrpc":"2.0","id":2.5,"method":"session/list"}\n')

        def refused() -> bool:
            return any(
                f.direction == "in"
                and isinstance(f.message, dict)
                and f.message.get("error", {}).get("code") == -32600
                for f in client.frames
            )

        await client.wait_until(refused)
        # The connection is still usable.
        assert (await client.list_sessions()) == {"sessions": []}


async def test_resume_sends_the_goal_snapshot_before_its_answer(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as first:
        sid = (await first.new_session(str(project)))["sessionId"]
        await first.prompt(sid, "/echo with a goal")
        goal = {"sessionId": sid, "action": "set", "objective": "wait here hang"}
        await first.call("_session/goal", goal)
        await first.call("_session/goal", {"sessionId": sid, "action": "pause"})
        await first.close_session(sid)
    async with harness.connect(initialize=True) as client:
        await client.resume_session(sid, str(project))

        def snapshots() -> list[Any]:
            return [
                u["_meta"]["goal"]
                for u in client.updates(sid)
                if u["sessionUpdate"] == "session_info_update" and "_meta" in u
            ]

        assert snapshots()[0]["objective"] == "wait here hang"
        assert snapshots()[0]["status"] == "paused"
        inbound = [
            (i, f.message)
            for i, f in enumerate(client.frames)
            if f.direction == "in" and isinstance(f.message, dict)
        ]
        answered = max(i for i, m in inbound if "result" in m)
        goal_at = min(
            i
            for i, m in inbound
            if m.get("method") == "session/update" and "_meta" in m["params"]["update"]
        )
        assert goal_at < answered
        client.validate(acp_schema)
