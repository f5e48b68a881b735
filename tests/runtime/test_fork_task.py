"""Forking a task: a new provisional task of the caller's with a copy of the history (all of
it or up to a message), the source's root, directories, model, mode and thinking level; the
same admission rules as a load of the source; the source untouched. Real SQLite store, demo
backend."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.model import ItemKind, TaskQuery
from maple_acp.runtime import AgentService, RejectionKind, RuntimeRejection, SessionLease
from maple_acp.testing.demo import run_prompt


async def new_lease(service: AgentService, nursery: trio.Nursery, cwd: Path) -> SessionLease:
    lease: SessionLease = await nursery.start(partial(service.serve_new_task, str(cwd)))
    return lease


async def fork(
    service: AgentService, nursery: trio.Nursery, task_id: str, cwd: Path, **kwargs: Any
) -> SessionLease:
    lease: SessionLease = await nursery.start(
        partial(service.fork_task, task_id, cwd=str(cwd), **kwargs)
    )
    return lease


async def source_task(service: AgentService, nursery: trio.Nursery, project: Path) -> SessionLease:
    lease = await new_lease(service, nursery, project)
    await run_prompt(lease, "first")
    await run_prompt(lease, "/think pondering\nsecond")
    return lease


async def test_a_fork_copies_the_history_and_settings_and_stays_hidden_until_prompted(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        source = await source_task(service, nursery, project)
        await source.set_mode("plan")
        before = await source.history()
        forked = await fork(service, nursery, source.task_id, project)
        assert forked.task_id != source.task_id
        assert await forked.history() == before
        for field in ("root", "model", "mode", "thought_level", "additional_directories"):
            assert getattr(forked.task, field) == getattr(source.task, field), field
        assert forked.task.account == source.task.account
        assert forked.task.provisional
        listed = await service.list_tasks()
        assert [task.id for task in listed.tasks] == [source.task_id]
        # Prompted, it is a task like any other; the source never sees its turns.
        await run_prompt(forked, "third")
        assert [task.id for task in (await service.list_tasks()).tasks] == [
            forked.task_id,
            source.task_id,
        ]
        assert await source.history() == before
        assert len(await forked.history()) > len(before)
        await forked.release(close=True)
        await source.release(close=True)


async def test_a_fork_up_to_a_message_ends_with_that_message(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        source = await source_task(service, nursery, project)
        history = await source.history()
        first_answer = next(item for item in history if item.kind is ItemKind.ASSISTANT)
        cut = history.index(first_answer) + 1
        forked = await fork(service, nursery, source.task_id, project, up_to=first_answer.item_id)
        assert await forked.history() == history[:cut]
        await forked.release(close=True)
        await source.release(close=True)


async def test_an_unprompted_fork_is_gone_when_closed(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        source = await source_task(service, nursery, project)
        forked = await fork(service, nursery, source.task_id, project)
        await forked.release(close=True)
        assert await service.store.get_task(forked.task_id) is None
        assert len(await source.history()) == 5
        await source.release(close=True)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"task_id": "no-such-task"}, RejectionKind.TASK_NOT_FOUND),
        ({"up_to": "no-such-message"}, RejectionKind.UNKNOWN_MESSAGE),
        ({"cwd": "elsewhere"}, RejectionKind.ROOT_MISMATCH),
    ],
)
async def test_a_refused_fork_creates_nothing(
    service: AgentService, project: Path, change: dict[str, Any], kind: RejectionKind
) -> None:
    async with trio.open_nursery() as nursery:
        source = await source_task(service, nursery, project)
        elsewhere = project.parent / "elsewhere"
        elsewhere.mkdir()
        cwd = elsewhere if change.get("cwd") == "elsewhere" else project
        task_id = change.get("task_id", source.task_id)
        with pytest.raises(RuntimeRejection) as caught:
            await fork(service, nursery, task_id, cwd, up_to=change.get("up_to"))
        assert caught.value.kind is kind
        query = TaskQuery(account=source.task.account, include_provisional=True)
        page = await service.store.list_tasks(query)
        assert [task.id for task in page.tasks] == [source.task_id]
        await source.release(close=True)


async def test_another_accounts_task_cannot_be_forked(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        source = await source_task(service, nursery, project)
        await source.release(close=False)
        service.sign_in("someone-else")
        with pytest.raises(RuntimeRejection) as caught:
            await fork(service, nursery, source.task_id, project)
        assert caught.value.kind is RejectionKind.WRONG_ACCOUNT


async def test_a_running_source_is_refused_and_an_idle_leased_one_is_not(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        source = await source_task(service, nursery, project)
        run = await source.start_run("/hang")
        with pytest.raises(RuntimeRejection) as caught:
            await fork(service, nursery, source.task_id, project)
        assert caught.value.kind is RejectionKind.RUN_ACTIVE
        run.cancel()
        await run.wait()
        # Still leased by the caller, now idle: its history may be read and copied.
        forked = await fork(service, nursery, source.task_id, project)
        assert await forked.history() == await source.history()
        await forked.release(close=True)
        await source.release(close=True)
