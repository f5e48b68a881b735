"""``AgentService.held_tasks()``: what a host's own window lists (held tasks and what each is
doing), read synchronously while the leases live."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from maple_acp.runtime import (
    AgentService,
    HeldTaskState,
    PermissionAnswer,
    PermissionRequest,
    SessionLease,
)


def states(service: AgentService) -> list[tuple[str, str, HeldTaskState]]:
    return [(held.task.id, held.mode, held.state) for held in service.held_tasks()]


async def test_held_tasks_follow_each_lease_from_idle_to_released(
    service: AgentService, project: Path
) -> None:
    assert service.held_tasks() == ()
    async with trio.open_nursery() as nursery:
        first: SessionLease = await nursery.start(service.serve_new_task, str(project))
        second: SessionLease = await nursery.start(service.serve_new_task, str(project))
        one, two = first.task_id, second.task_id
        # In the order the leases were made, each with its row as the lease sees it.
        assert states(service) == [
            (one, "code", HeldTaskState.IDLE),
            (two, "code", HeldTaskState.IDLE),
        ]
        assert service.held_tasks()[0].task == first.task

        run = await first.start_run("/hang")
        assert states(service)[0] == (one, "code", HeldTaskState.RUNNING)
        first.cancel_run()
        await run.wait()
        assert states(service)[0] == (one, "code", HeldTaskState.IDLE)

        shell = json.dumps({"command": "true"})
        asking = await second.start_run(f"/tool shell {shell}")
        async for event in asking.events():
            if isinstance(event, PermissionRequest):
                assert states(service)[1] == (two, "code", HeldTaskState.ASKING)
                assert event.responder.answer(PermissionAnswer.DENY_ONCE.value)
        assert states(service)[1] == (two, "code", HeldTaskState.IDLE)

        await second.set_mode("plan")
        second.revoke()
        assert states(service)[1] == (two, "plan", HeldTaskState.REVOKED)
        await second.release(close=True)
        assert states(service) == [(one, "code", HeldTaskState.IDLE)]
        await first.release(close=True)
    assert service.held_tasks() == ()
