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
)
from maple_acp.testing.demo import collect_events


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
    assert re.search(r"prompt run \S+ of task \S+ ended: failed", text)
    assert re.search(r"permission for tool shell in run \S+: allowed once", text)
    assert re.search(r"goal of task \S+: none -> active", text)
    assert re.search(r"goal of task \S+: active -> complete \(iterations 1\)", text)
    # What nobody may read there, at any level.
    for secret in (relay_secret, prompt_secret, goal_secret, failure_secret):
        assert secret not in caplog.text
        for record in caplog.records:
            assert secret not in record.getMessage()
            assert secret not in repr(record.args)
