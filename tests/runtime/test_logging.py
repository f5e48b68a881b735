"""The runtime's operational log lines (prompt start and end, permission decisions, goal
transitions) say what happened without a secret: DEBUG output is searched for planted ones."""

from __future__ import annotations

import json
import logging
import re
import secrets
from pathlib import Path

import pytest
import trio

from maple_acp.runtime import (
    AgentService,
    CycleStarted,
    GoalChanged,
    GoalStatus,
    PermissionRequest,
    SessionLease,
    Turn,
)
from maple_acp.testing.demo import collect_events, demo_service


async def test_log_lines_say_what_happened_and_never_a_secret(
    service: AgentService, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    relay_secret = "relay-" + secrets.token_hex(10)
    prompt_secret = "prompt-" + secrets.token_hex(10)
    goal_secret = "goal-" + secrets.token_hex(10)
    failure_secret = "failure-" + secrets.token_hex(10)
    shell = json.dumps({"command": f"echo {prompt_secret} $MAPLE_TOKEN"})
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project),
                relay=service.accept_relay({"MAPLE_TOKEN": relay_secret}),
                task_status=task_status,
            )
        )
        run = await lease.start_run(f"{prompt_secret}\n/usage 7 5\n/tool shell {shell}")
        async for event in run.events():
            if isinstance(event, PermissionRequest):
                assert event.responder.answer("allow_once")
        assert (await run.wait()).state.value == "completed"
        failed = await lease.start_run(f"/fail {failure_secret}")
        await collect_events(failed)
        session = lease.session_events()
        await lease.set_goal(f"{goal_secret} complete after 1")
        async for change in session:
            if isinstance(change, CycleStarted):
                await collect_events(change.run)
            if (
                isinstance(change, GoalChanged)
                and change.goal is not None
                and change.goal.status is GoalStatus.COMPLETE
            ):
                break
        await lease.release(close=True)
    runtime_lines = [
        r.getMessage() for r in caplog.records if r.name.startswith("maple_acp.runtime")
    ]
    text = "\n".join(runtime_lines)
    # What an operator needs to see.
    assert re.search(r"prompt run \S+ of task \S+ started", text)
    assert re.search(
        r"prompt run \S+ of task \S+ ended: completed \(end_turn\) in [\d.]+ s, \d+ updates, "
        r"tokens in 7 out 5 total 12",
        text,
    ), text
    # A failed run's line says why, without quoting what the backend's text quoted.
    assert re.search(
        r"prompt run \S+ of task \S+ ended: failed \(the backend failed the turn\) in ", text
    )
    assert re.search(r"permission for tool shell in run \S+: allowed once", text)
    assert re.search(r"goal of task \S+: none -> active", text)
    assert re.search(r"goal of task \S+: active -> complete \(iterations 1\)", text)
    # What nobody may read there, at any level.
    for secret in (relay_secret, prompt_secret, goal_secret, failure_secret):
        assert secret not in caplog.text
        for record in caplog.records:
            assert secret not in record.getMessage()
            assert secret not in repr(record.args)


class _Crashing:
    """An engine whose turn raises an exception that quotes the prompt."""

    async def run_turn(self, turn: Turn) -> None:
        _deep_inside_the_engine(turn.prompt)


def _deep_inside_the_engine(prompt: str) -> None:
    raise ValueError(f"cannot handle {prompt!r}")


async def test_a_backend_crash_logs_where_it_happened_not_what_it_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "prompt-" + secrets.token_hex(10)
    async with demo_service(tmp_path, backend=_Crashing()) as service:
        project = tmp_path / "project"
        project.mkdir()
        async with trio.open_nursery() as nursery:
            lease: SessionLease = await nursery.start(
                lambda task_status: service.serve_new_task(str(project), task_status=task_status)
            )
            run = await lease.start_run(secret)
            await collect_events(run)
            outcome = await run.wait()
            await lease.release(close=True)
    assert outcome.failure == "the agent backend failed: ValueError"
    (line,) = [r.getMessage() for r in caplog.records if "agent backend raised" in r.getMessage()]
    assert line.startswith("agent backend raised ValueError in run ")
    assert "_deep_inside_the_engine" in line
    assert "test_logging.py" in line
    assert re.search(r"ended: failed \(the backend raised ValueError\) in [\d.]+ s", caplog.text)
    assert secret not in caplog.text


async def test_a_fresh_store_logs_created_not_migrated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.store")
    async with demo_service(tmp_path):
        pass
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("maple_acp.store")]
    assert any(line.startswith("task store created at ") for line in lines), lines
    assert not [line for line in lines if "migrated from 0" in line]
    caplog.clear()
    async with demo_service(tmp_path):
        pass
    assert not [r for r in caplog.records if "task store" in r.getMessage()]
