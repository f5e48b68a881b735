"""``maple_acp.testing`` for a host's own tests: each promise checker fails on the frames that
break it, the client checks frames against the schema as they arrive, a harness runs the
host's own engine, held permissions wait for the test, and the driver runs Trio steps from
plain functions with time standing still between them."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from maple_acp.runtime import AskForTools, ModelInfo, StaticModelCatalog, ToolRequest, Turn
from maple_acp.testing.client import AcpTestClient, Frame, HeldPermissions, open_acp_client
from maple_acp.testing.driver import TrioDriver
from maple_acp.testing.invariants import (
    AcpLedger,
    InvariantViolation,
    check_frames,
    held_sessions,
)
from maple_acp.testing.schema import AcpSchema, SchemaViolation, load_acp_schema
from maple_acp.testing.service import running_acp

SID = "s1"


def out(msg_id: Any, method: str, **params: Any) -> Frame:
    message = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}
    return Frame("out", orjson.dumps(message), message)


def answer(msg_id: Any, result: Any = None, code: int | None = None) -> Frame:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id}
    if code is None:
        message["result"] = {} if result is None else result
    else:
        message["error"] = {"code": code, "message": "no"}
    return Frame("in", orjson.dumps(message), message)


def update(sid: str = SID) -> Frame:
    message = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk"}},
    }
    return Frame("in", orjson.dumps(message), message)


PROMPTED = [out(1, "session/prompt", sessionId=SID), update(), answer(1, {"stopReason": "x"})]


def queue_changed(sid: str = SID) -> Frame:
    message = {
        "jsonrpc": "2.0",
        "method": "_session/queue_changed",
        "params": {"sessionId": sid, "entries": []},
    }
    return Frame("in", orjson.dumps(message), message)


def test_a_well_behaved_exchange_passes() -> None:
    frames = [
        *PROMPTED,
        out(2, "session/close", sessionId=SID),
        answer(2),
        out(3, "session/prompt", sessionId=SID),
        answer(3, code=-32002),
        out(4, "session/load", sessionId=SID),
        update(),
        answer(4),
        out(5, "session/prompt", sessionId=SID),
        update(),
        answer(5, {"stopReason": "end_turn"}),
    ]
    check_frames(frames, complete=True)
    assert held_sessions(frames) == {SID}


@pytest.mark.parametrize(
    ("frames", "says"),
    [
        ([*PROMPTED, answer(1)], "answered twice"),
        ([answer(9)], "unknown id"),
        ([*PROMPTED, update()], "after its prompt's answer"),
        ([out(2, "session/close", sessionId=SID), answer(2), update()], "close's answer"),
        (
            [out(2, "session/close", sessionId=SID), answer(2), queue_changed()],
            "close's answer",
        ),
        (
            [
                out(2, "session/close", sessionId=SID),
                answer(2),
                out(3, "session/prompt", sessionId=SID),
                answer(3, {"stopReason": "end_turn"}),
            ],
            "written after its close was answered, succeeded",
        ),
    ],
)
def test_each_broken_promise_is_named(frames: list[Frame], says: str) -> None:
    with pytest.raises(InvariantViolation, match=says):
        check_frames(frames)


def test_the_queue_may_tell_its_change_after_a_turn_answered() -> None:
    # The last waiting prompt's start empties the queue; its notification may follow the
    # answer of the turn before it. Anything else about the session may not.
    check_frames([*PROMPTED, queue_changed()], complete=True)
    with pytest.raises(InvariantViolation, match="after its prompt's answer"):
        check_frames([*PROMPTED, queue_changed(), update()])


def test_a_request_never_answered_fails_only_a_complete_check() -> None:
    frames = [out(1, "session/prompt", sessionId=SID)]
    check_frames(frames)
    with pytest.raises(InvariantViolation, match="never answered"):
        check_frames(frames, complete=True)


class AskingEngine:
    """A host's own engine: asks before it answers."""

    async def run_turn(self, turn: Turn) -> None:
        request = ToolRequest(tool_id=f"{turn.run_id}-t", name="tool", title="a tool")
        allowed = await turn.ask_permission(request)
        await turn.send_text(f"{turn.prompt}: {'allowed' if allowed else 'denied'}")


async def test_a_harness_runs_the_hosts_own_engine_and_held_permissions_wait(
    tmp_path: Path, acp_schema: AcpSchema
) -> None:
    held = HeldPermissions()
    async with running_acp(
        tmp_path,
        backend=AskingEngine(),
        catalog=StaticModelCatalog((ModelInfo(id="own", name="Own"),)),
        policy=AskForTools(frozenset({"tool"})),
    ) as harness:
        ledger = AcpLedger(harness.runtime)
        conn = ledger.watch(
            await harness.open_connection(initialize=True, permission=held, schema=acp_schema)
        )
        sid = (await conn.client.new_session(str(tmp_path)))["sessionId"]
        prompt_id = await conn.client.send(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
        )
        await held.wait_pending()
        assert conn.client.answer(prompt_id) is None  # the turn waits for the test
        held.answer_next("allow")
        await conn.client.wait_until(lambda: conn.client.answer(prompt_id) is not None)
        assert conn.client.answer(prompt_id)["result"]["stopReason"] == "end_turn"
        assert conn.client.text(sid) == "hi: allowed"
        ledger.check(complete=True)
        assert harness.runtime.lease_of(sid) is not None
        await ledger.disconnect(conn)
        assert harness.runtime.lease_of(sid) is None


async def test_the_client_checks_each_frame_against_the_schema_as_it_arrives(
    acp_schema: AcpSchema,
) -> None:
    # The test plays an agent that answers session/new without the session's id.
    client_end, agent_end = trio.testing.memory_stream_pair()
    seen: list[AcpTestClient] = []

    async def use() -> None:
        async with open_acp_client(client_end, schema=acp_schema) as client:
            seen.append(client)
            await client.send("session/new", {"cwd": "/project", "mcpServers": []})
            await client.wait_until(lambda: client.violation is not None)
            # Raised when the block ends normally, so a test cannot forget to look.

    async def agent() -> None:
        line = await agent_end.receive_some()
        request = orjson.loads(line)
        await agent_end.send_all(
            orjson.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {}}) + b"\n"
        )

    async def both() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent)
            await use()

    with pytest.raises(ExceptionGroup) as raised:
        await both()
    assert raised.group_contains(SchemaViolation, match="NewSessionResponse")
    assert seen[0].violation is not None


def test_the_schema_loads_wherever_the_suite_runs() -> None:
    # The suite names the directory in ACP_SCHEMA_DIR, as a host's CI without network does.
    schema = load_acp_schema()
    assert (schema.directory / "schema.json").is_file()
    assert load_acp_schema(2).version == 2


def test_a_driver_runs_steps_and_holds_time_still_between_them() -> None:
    driver = TrioDriver()
    try:
        assert driver.run(trio.sleep, 5) is None  # a step that waits for a deadline ends
        assert driver.clock.current_time() == 5.0
        fired = trio.Event()

        async def later() -> None:
            await trio.sleep(1)
            fired.set()

        driver.start_soon(later)
        assert driver.clock.current_time() == 5.0  # nothing moves between steps
        assert not driver.call(fired.is_set)
        driver.advance(1)
        assert driver.call(fired.is_set)

        async def fails() -> None:
            raise ValueError("the step's own error")

        with pytest.raises(ValueError, match="own error"):
            driver.run(fails)
        assert driver.run(trio.sleep, 0) is None  # the loop goes on after a failed step
    finally:
        driver.close()


def test_quiet_does_not_wait_for_children_the_run_did_not_start() -> None:
    # Another test's process still running, and one ended but not yet reaped: neither is the
    # service's, so neither may hold a step open.
    running = subprocess.Popen(["sleep", "30"])
    ended = subprocess.Popen(["true"])
    try:
        time.sleep(0.2)  # ended by now, and not reaped: a zombie
        driver = TrioDriver()
        try:
            assert driver.run(trio.sleep, 5) is None
            assert driver.clock.current_time() == 5.0
        finally:
            driver.close()
    finally:
        running.kill()
        running.wait()
        ended.wait()
