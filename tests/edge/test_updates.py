"""The update kinds a backend can produce, projected by the edge from the demo backend's
events: plans, context usage, commands, diffs and locations, titles; every frame validated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import Harness, running_service

from maple_acp.runtime import StopReason, Turn, TurnResult
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema


def _in_frames(client: AcpTestClient) -> list[tuple[int, Any]]:
    return [
        (i, f.message)
        for i, f in enumerate(client.frames)
        if f.direction == "in" and isinstance(f.message, dict)
    ]


def _answer_index(client: AcpTestClient, method: str) -> int:
    sent = {
        f.message["id"]
        for f in client.frames
        if f.direction == "out"
        and isinstance(f.message, dict)
        and f.message.get("method") == method
    }
    return max(i for i, m in _in_frames(client) if m.get("id") in sent and "result" in m)


def _update_indexes(client: AcpTestClient, kind: str) -> list[int]:
    return [
        i
        for i, m in _in_frames(client)
        if m.get("method") == "session/update" and m["params"]["update"]["sessionUpdate"] == kind
    ]


def _session_updates_between(client: AcpTestClient, sid: str, start: int, end: int) -> list[Any]:
    return [
        m
        for i, m in _in_frames(client)
        if start < i < end
        and m.get("method") == "session/update"
        and m["params"]["sessionId"] == sid
    ]


def _goal_status(client: AcpTestClient, sid: str) -> str | None:
    """The status in the session's latest goal snapshot, if any."""
    snapshots = [
        u["_meta"]["goal"]
        for u in client.updates(sid)
        if u["sessionUpdate"] == "session_info_update" and "goal" in u.get("_meta", {})
    ]
    return snapshots[-1]["status"] if snapshots else None


async def test_commands_follow_a_new_answer_and_precede_a_load_or_resume_answer(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    """A new session announces after its answer (the client has no id before it); a load or
    a resume announces everything attach-caused (commands, goal) before its answer, and
    nothing for the session follows it until a later request."""
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.wait_until(
            lambda: len(_update_indexes(client, "available_commands_update")) == 1
        )
        [after_new] = _update_indexes(client, "available_commands_update")
        assert after_new > _answer_index(client, "session/new")
        commands = next(
            u for u in client.updates(sid) if u["sessionUpdate"] == "available_commands_update"
        )["availableCommands"]
        names = {c["name"] for c in commands}
        assert {"echo", "plan", "context"} <= names
        assert all(c["description"] for c in commands)
        await client.prompt(sid, "/echo hello")
        # The goal is set and paused while a prompt holds the session, so no goal cycle can
        # start: a cycle cancelled by the pause publishes its own snapshot whenever it ends,
        # which may be after the attach below, and what the attach announces must be its own.
        async with trio.open_nursery() as nursery:

            async def held() -> None:
                answer = await client.prompt(sid, "/echo started\n/hang")
                assert answer["stopReason"] == "cancelled"

            nursery.start_soon(held)
            await client.wait_until(lambda: "started" in client.text(sid))
            goal = {"sessionId": sid, "objective": "x"}
            await client.call("_session/goal", {**goal, "action": "set"})
            await client.call("_session/goal", {"sessionId": sid, "action": "pause"})
            await client.cancel(sid)
        await client.wait_until(lambda: _goal_status(client, sid) == "paused")
        for method, attach in (
            ("session/load", client.load_session),
            ("session/resume", client.resume_session),
        ):
            before = len(client.frames)
            await attach(sid, str(project))
            answered = _answer_index(client, method)
            # A request that round-trips: whatever the attach caused was queued before it.
            await client.list_sessions()
            listed = _answer_index(client, "session/list")
            announced = [
                m["params"]["update"]["sessionUpdate"]
                for m in _session_updates_between(client, sid, before - 1, answered)
            ]
            assert "available_commands_update" in announced, method
            assert "session_info_update" in announced, method  # the goal snapshot
            assert _session_updates_between(client, sid, answered, listed) == [], method
        client.validate(acp_schema)


async def test_plan_context_diff_and_location_updates(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/plan [x] read; [>] write; check")
        await client.prompt(sid, "/context 1500 1000")
        write = {"path": "notes.txt", "content": "a\nb\n"}
        await client.prompt(sid, "/tool write_file " + json.dumps(write))
        updates = client.updates(sid)
        [plan] = [u for u in updates if u["sessionUpdate"] == "plan"]
        assert plan["entries"] == [
            {"content": "read", "priority": "medium", "status": "completed"},
            {"content": "write", "priority": "medium", "status": "in_progress"},
            {"content": "check", "priority": "medium", "status": "pending"},
        ]
        [usage] = [u for u in updates if u["sessionUpdate"] == "usage_update"]
        assert (usage["used"], usage["size"]) == (1500, 1000)
        rows = [u for u in updates if u["sessionUpdate"] in ("tool_call", "tool_call_update")]
        final = rows[-1]
        assert final["status"] == "completed"
        target = str((project / "notes.txt").resolve())
        [diff] = [c for c in final["content"] if c["type"] == "diff"]
        assert diff == {"type": "diff", "path": target, "oldText": None, "newText": "a\nb\n"}
        assert [loc["path"] for loc in final["locations"]] == [target]
        client.validate(acp_schema)


async def test_load_replays_the_title_and_the_latest_plan(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as first:
        sid = (await first.new_session(str(project)))["sessionId"]
        await first.prompt(sid, "Plan the work\n/plan one; two")
        await first.prompt(sid, "/plan [x] one; [x] two")
        titles = [u["title"] for u in first.updates(sid) if "title" in u]
        assert titles == ["Plan the work"]
        await first.close_session(sid)
    async with harness.connect(initialize=True) as second:
        await second.load_session(sid, str(project))
        replay = second.updates(sid)
        plans = [u for u in replay if u["sessionUpdate"] == "plan"]
        assert [p["entries"][0]["status"] for p in plans] == ["completed"]
        assert [u["title"] for u in replay if "title" in u] == ["Plan the work"]
        loaded_at = _answer_index(second, "session/load")
        for kind in ("plan", "session_info_update"):
            assert all(i < loaded_at for i in _update_indexes(second, kind))
        second.validate(acp_schema)


class _ReasonBackend:
    """Answers a prompt naming a stop reason by stopping for that reason."""

    async def run_turn(self, turn: Turn) -> TurnResult:
        await turn.send_text("stopping")
        return TurnResult(stop_reason=StopReason(turn.prompt.strip()))


@pytest.mark.parametrize("reason", [r.value for r in StopReason])
async def test_a_completed_turn_answers_the_backends_stop_reason(
    tmp_path: Path, project: Path, acp_schema: AcpSchema, reason: str
) -> None:
    async with (
        running_service(tmp_path, backend=_ReasonBackend()) as harness,
        harness.connect(initialize=True) as client,
    ):
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, reason)
        assert answer["stopReason"] == reason
        client.validate(acp_schema)
