"""Permissions: the host policy, exact-run responders, and every fail-closed form."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from runtime_helpers import exists, next_event, of_type

from maple_acp.model import ToolStatus
from maple_acp.runtime import (
    EXTERNAL_MCP_TOOL,
    AgentService,
    AskForTools,
    PermissionClass,
    PermissionRequest,
    RunState,
    ToolRequest,
    ToolRow,
)
from maple_acp.runtime._permissions import classify


def shell(command: str) -> str:
    return "/tool shell " + json.dumps({"command": command})


def touch(path: Path) -> str:
    return shell(f"touch {path}")


def test_external_mcp_is_always_asked_whatever_the_policy_says() -> None:
    allow_all = AskForTools(frozenset())
    request = ToolRequest(tool_id="t", name=EXTERNAL_MCP_TOOL)
    assert classify(allow_all, request) is PermissionClass.ASK
    assert classify(allow_all, ToolRequest(tool_id="t", name="shell")) is PermissionClass.ALLOW


async def test_allow_once_runs_the_tool(service: AgentService, project: Path) -> None:
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(touch(marker))
        events = run.events()
        request = await next_event(events, PermissionRequest)
        assert request.request.name == "shell"
        assert request.responder.answer("allow_once")
        rest = [event async for event in events]
        assert (await run.wait()).state is RunState.COMPLETED
        assert exists(marker)
        assert of_type(rest, ToolRow)[-1].tool.status is ToolStatus.COMPLETED
        await lease.release(close=True)


async def test_deny_once_skips_the_tool_and_the_run_goes_on(
    service: AgentService, project: Path
) -> None:
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(touch(marker) + "\n/echo still here")
        events = run.events()
        request = await next_event(events, PermissionRequest)
        assert run.answer(request.responder.id, "deny_once")
        rest = [event async for event in events]
        assert (await run.wait()).state is RunState.COMPLETED
        assert not exists(marker)
        assert of_type(rest, ToolRow)[-1].tool.status is ToolStatus.FAILED
        await lease.release(close=True)


async def _pending(service: AgentService, project: Path, nursery: trio.Nursery, marker: Path):  # type: ignore[no-untyped-def]
    lease = await nursery.start(service.serve_new_task, str(project))
    run = await lease.start_run(touch(marker))
    events = run.events()
    request = await next_event(events, PermissionRequest)
    return lease, run, events, request


async def _assert_failed_closed(run, events, marker: Path) -> None:  # type: ignore[no-untyped-def]
    rest = [event async for event in events]
    outcome = await run.wait()
    assert outcome.state is RunState.CANCELLED
    assert not exists(marker)
    final = of_type(rest, ToolRow)[-1].tool.status
    assert final in (ToolStatus.CANCELLED, ToolStatus.FAILED)
    assert run.pending_permissions == ()


async def test_unknown_option_fails_closed(service: AgentService, project: Path) -> None:
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease, run, events, request = await _pending(service, project, nursery, marker)
        assert not request.responder.answer("allow_always")
        await _assert_failed_closed(run, events, marker)
        await lease.release(close=True)


async def test_no_answer_fails_closed(service: AgentService, project: Path) -> None:
    # None is what the edge hands over for a malformed or failed client answer.
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease, run, events, request = await _pending(service, project, nursery, marker)
        assert not request.responder.answer(None)
        await _assert_failed_closed(run, events, marker)
        await lease.release(close=True)


async def test_unknown_responder_id_fails_closed(service: AgentService, project: Path) -> None:
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease, run, events, _ = await _pending(service, project, nursery, marker)
        assert not run.answer("not-a-responder", "allow_once")
        await _assert_failed_closed(run, events, marker)
        await lease.release(close=True)


async def test_reused_answer_fails_closed(service: AgentService, project: Path) -> None:
    first_marker = project / "first"
    marker = project / "second"
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(touch(first_marker) + "\n" + touch(marker))
        events = run.events()
        first = await next_event(events, PermissionRequest)
        assert first.responder.answer("deny_once")
        await next_event(events, PermissionRequest)
        # The first responder again, while the second request waits: deny all, cancel.
        assert not first.responder.answer("allow_once")
        await _assert_failed_closed(run, events, marker)
        assert not exists(first_marker)
        await lease.release(close=True)


async def test_duplicate_answer_fails_closed_and_never_allows(
    service: AgentService, project: Path
) -> None:
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease, _run, events, request = await _pending(service, project, nursery, marker)
        assert request.responder.answer("deny_once")
        assert not request.responder.answer("allow_once")
        [event async for event in events]
        assert not exists(marker)
        await lease.release(close=True)


async def test_answer_for_another_run_fails_closed_on_the_addressed_run(
    service: AgentService, project: Path, tmp_path: Path
) -> None:
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    marker_a, marker_b = project / "a", other_dir / "b"
    async with trio.open_nursery() as nursery:
        lease_a, run_a, events_a, request_a = await _pending(service, project, nursery, marker_a)
        lease_b, run_b, events_b, _ = await _pending(service, other_dir, nursery, marker_b)
        assert not run_b.answer(request_a.responder.id, "allow_once")
        await _assert_failed_closed(run_b, events_b, marker_b)
        # The other run's request is untouched and still answerable.
        assert request_a.responder.answer("allow_once")
        [event async for event in events_a]
        assert (await run_a.wait()).state is RunState.COMPLETED
        assert exists(marker_a)
        await lease_a.release(close=True)
        await lease_b.release(close=True)


async def test_answer_after_cancel_never_allows(service: AgentService, project: Path) -> None:
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease, run, events, request = await _pending(service, project, nursery, marker)
        run.cancel()
        assert not request.responder.answer("allow_once")
        await _assert_failed_closed(run, events, marker)
        await lease.release(close=True)


async def test_answer_after_revoke_never_allows(service: AgentService, project: Path) -> None:
    marker = project / "ran"
    async with trio.open_nursery() as nursery:
        lease, run, events, request = await _pending(service, project, nursery, marker)
        lease.revoke()
        assert not request.responder.answer("allow_once")
        await _assert_failed_closed(run, events, marker)
        await lease.release()
