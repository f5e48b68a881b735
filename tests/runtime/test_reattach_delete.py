"""Re-attach (``lease.replace_router``) and ``service.delete_task`` at the runtime level."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from runtime_helpers import LoopRouter

from maple_acp.model import TaskRecord, TaskSurface
from maple_acp.runtime import (
    AgentService,
    CycleStarted,
    RejectionKind,
    RuntimeRejection,
    SessionLease,
)
from maple_acp.testing.demo import collect_events, demo_service, run_prompt


class ConnectFailed(Exception):
    pass


def factory_of(router: LoopRouter) -> Any:
    async def start(nursery: trio.Nursery, task_id: str) -> LoopRouter:
        await nursery.start(router.serve)
        return router

    return start


async def failing_factory(nursery: trio.Nursery, task_id: str) -> LoopRouter:
    await trio.lowlevel.checkpoint()
    raise ConnectFailed("the new servers did not answer")


async def test_replace_router_swaps_only_after_the_new_one_is_up(
    service: AgentService, project: Path
) -> None:
    first, second = LoopRouter("first"), LoopRouter("second")
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project), router_factory=factory_of(first), task_status=task_status
            )
        )
        assert lease.tools.router is first
        # A failing re-attach raises the connect error and keeps the old router working.
        with pytest.raises(ConnectFailed):
            await lease.replace_router(failing_factory)
        assert lease.tools.router is first
        assert not first.revoked
        assert await lease.tools.call_external("t", {}) == {
            "content": [{"type": "text", "text": "first:t"}]
        }
        await lease.replace_router(factory_of(second))
        assert lease.tools.router is second
        assert second.serving
        await trio.testing.wait_all_tasks_blocked()
        assert first.revoked
        assert not first.serving
        # A re-attach without servers drops the router.
        await lease.replace_router(None)
        assert lease.tools.router is None
        assert lease.tools.external_tools == ()
        await trio.testing.wait_all_tasks_blocked()
        assert second.revoked
        assert not second.serving
        await lease.release(close=True)


async def test_replace_router_is_refused_while_a_run_or_a_prompt_is_active(
    service: AgentService, project: Path
) -> None:
    router = LoopRouter("kept")
    calls: list[str] = []

    async def counting_factory(nursery: trio.Nursery, task_id: str) -> LoopRouter:
        calls.append("called")
        never = LoopRouter("never")
        await nursery.start(never.serve)
        return never

    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project), router_factory=factory_of(router), task_status=task_status
            )
        )
        run = await lease.start_run("/hang")
        with pytest.raises(RuntimeRejection) as caught:
            await lease.replace_router(counting_factory)
        assert caught.value.kind is RejectionKind.RUN_ACTIVE
        run.cancel()
        await collect_events(run)
        with lease.claim_prompt():
            with pytest.raises(RuntimeRejection) as caught:
                await lease.replace_router(counting_factory)
            assert caught.value.kind is RejectionKind.RUN_ACTIVE
        # A goal cycle is a run too.
        session = lease.session_events()
        await lease.set_goal("hang forever")
        async for event in session:
            if isinstance(event, CycleStarted):
                break
        with pytest.raises(RuntimeRejection) as caught:
            await lease.replace_router(counting_factory)
        assert caught.value.kind is RejectionKind.RUN_ACTIVE
        await lease.clear_goal()
        assert calls == []
        assert lease.tools.router is router
        assert not router.revoked
        await lease.release(close=True)
    assert router.revoked


def foreign_task(root: Path) -> TaskRecord:
    return TaskRecord(
        id="foreign",
        account="someone-else",
        root=os.path.realpath(root),
        created_ms=1,
        updated_ms=1,
        surface=TaskSurface.EXTERNAL,
        model="demo-echo",
    )


async def refused(kind: RejectionKind, call: Any, *args: Any) -> None:
    with pytest.raises(RuntimeRejection) as caught:
        await call(*args)
    assert caught.value.kind is kind, caught.value


async def test_delete_task_refusals_then_a_durable_delete(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    async with demo_service(data) as service:
        await service.store.create_task(foreign_task(project))
        await refused(RejectionKind.TASK_NOT_FOUND, service.delete_task, "no-such-task")
        await refused(RejectionKind.TASK_NOT_FOUND, service.delete_task, "foreign")
        await service.set_project_trust(str(project), True)
        async with trio.open_nursery() as nursery:
            lease: SessionLease = await nursery.start(
                lambda task_status: service.serve_new_task(str(project), task_status=task_status)
            )
            task_id = lease.task_id
            session = lease.session_events()
            await run_prompt(lease, "hello")
            await lease.set_goal("hang forever")
            async for event in session:
                if isinstance(event, CycleStarted):
                    break
            assert lease.active_run is not None
            await refused(RejectionKind.RUN_ACTIVE, service.delete_task, task_id)
            await lease.clear_goal()
            await lease.drain()
            await refused(RejectionKind.TASK_LEASED, service.delete_task, task_id)
            await lease.release(close=True)
        assert await service.store.get_goal(task_id) is None
        await service.delete_task(task_id)
        assert await service.store.get_task(task_id) is None
        assert await service.store.history(task_id) == []
        assert all(t.id != task_id for t in (await service.list_tasks()).tasks)
        await refused(RejectionKind.TASK_NOT_FOUND, service.delete_task, task_id)
        await refused(RejectionKind.TASK_NOT_FOUND, service.task_history, task_id)
        async with trio.open_nursery() as nursery:
            await refused(
                RejectionKind.TASK_NOT_FOUND,
                nursery.start,
                lambda task_status: service.serve_task(
                    task_id, str(project), task_status=task_status
                ),
            )
        # The project's trust decision is not the task's: it stays.
        assert await service.project_trust(str(project)) is True
        assert await service.store.get_task("foreign") is not None
    # After a restart the task is still gone.
    async with demo_service(data) as service:
        assert await service.store.get_task(task_id) is None
        assert all(t.id != task_id for t in (await service.list_tasks()).tasks)


async def test_delete_task_keeps_a_goal_out_of_the_store(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    async with demo_service(data) as service:
        async with trio.open_nursery() as nursery:
            lease: SessionLease = await nursery.start(
                lambda task_status: service.serve_new_task(str(project), task_status=task_status)
            )
            await run_prompt(lease, "hello")
            await lease.set_goal("hang forever")
            await lease.pause_goal()
            task_id = lease.task_id
            await lease.release(close=True)
        assert await service.store.get_goal(task_id) is not None
        await service.delete_task(task_id)
        assert await service.store.get_goal(task_id) is None


async def test_a_reattach_names_the_same_root(service: AgentService, project: Path) -> None:
    other = project.parent / "other"
    other.mkdir()
    link = project.parent / "link"
    link.symlink_to(project)
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(str(project), task_status=task_status)
        )
        # Through a symlink is the same directory.
        await service.check_root(lease, str(link))
        with pytest.raises(RuntimeRejection) as caught:
            await service.check_root(lease, str(other))
        assert caught.value.kind is RejectionKind.ROOT_MISMATCH
        for bad in ("relative", str(project / "missing")):
            with pytest.raises(RuntimeRejection) as caught:
                await service.check_root(lease, bad)
            assert caught.value.kind is RejectionKind.INVALID_CWD
        with pytest.raises(RuntimeRejection) as caught:
            await service.check_root(lease, str(project), allowed_roots=(str(other),))
        assert caught.value.kind is RejectionKind.INVALID_CWD
        await lease.release(close=True)
