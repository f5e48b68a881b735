"""Child sessions in the runtime: a delegation's task, history, events and outcome; the
limits; cancelling one child alone or its parent; the store's view of children."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio
import trio.testing

from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.model import ItemKind, TaskQuery
from maple_acp.runtime import (
    MAX_RUNNING_CHILDREN,
    MAX_SESSION_CHILDREN,
    AgentService,
    Backend,
    ChildAnnounced,
    ChildEnded,
    ChildEvent,
    ChildRunning,
    DelegationResult,
    PermissionAnswer,
    PermissionRequest,
    RejectionKind,
    RunEnded,
    RunEvent,
    RunState,
    RuntimeRejection,
    SessionLease,
    TextChunk,
    ToolRow,
    ToolStatus,
    Turn,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, demo_service, run_prompt
from maple_acp.testing.store import temp_store


async def _answering(lease: SessionLease, text: str, answer: PermissionAnswer) -> list[RunEvent]:
    """Run ``text``, answering every permission question (a child's too) with ``answer``."""
    run = await lease.start_run(text)
    events: list[RunEvent] = []
    async for event in run.events():
        events.append(event)
        inner = event.event if isinstance(event, ChildEvent) else event
        if isinstance(inner, PermissionRequest):
            inner.responder.answer(answer)
    return events


def _delegate_row(events: list[RunEvent]) -> ToolRow:
    rows = [e for e in events if isinstance(e, ToolRow) and e.tool.name == "delegate"]
    return rows[-1]


async def test_a_delegation_runs_a_child_with_its_own_history(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events = await _answering(
            lease, "/delegate Look around :: list the files", PermissionAnswer.ALLOW_ONCE
        )
        kinds = [type(e) for e in events]
        assert kinds.index(ChildAnnounced) < kinds.index(ChildRunning) < kinds.index(ChildEvent)
        assert kinds.index(ChildEnded) < kinds.index(RunEnded)
        announced = next(e for e in events if isinstance(e, ChildAnnounced))
        assert (announced.title, announced.prompt) == ("Look around", "list the files")
        ended = next(e for e in events if isinstance(e, ChildEnded))
        assert ended.outcome.state is RunState.COMPLETED
        assert ended.answer == "answer: list the files"
        row = _delegate_row(events)
        assert row.tool.status is ToolStatus.COMPLETED
        assert row.tool.output_text == "answer: list the files"
        # The child's shell row and text are the child's events, never the parent's own.
        inner = [e.event for e in events if isinstance(e, ChildEvent)]
        assert any(isinstance(e, ToolRow) and e.tool.name == "shell" for e in inner)
        assert not any(isinstance(e, ToolRow) and e.tool.name == "shell" for e in events)
        # The child's history: the delegation prompt and its own turn, nothing of its parent.
        children = await service.store.children(lease.task_id)
        assert [child.id for child in children] == [announced.child_id]
        child = children[0]
        assert (child.parent_id, child.parent_tool_id) == (lease.task_id, row.tool_id)
        assert (child.root, child.mode, child.model) == (
            lease.task.root,
            lease.task.mode,
            lease.task.model,
        )
        history = await service.store.history(child.id)
        assert history[0].kind is ItemKind.USER
        assert history[0].text == "list the files"
        assert "/delegate" not in "".join(item.text for item in history)
        assert history[-1].text == "answer: list the files"
        # Listed: the parent only.
        page = await service.store.list_tasks(TaskQuery(account=lease.account))
        assert [task.id for task in page.tasks] == [lease.task_id]
        await lease.release(close=True)


async def test_a_denied_child_permission_fails_closed_in_the_child_only(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events = await _answering(
            lease, "/delegate T :: work\n/echo after", PermissionAnswer.DENY_ONCE
        )
        inner = [e.event for e in events if isinstance(e, ChildEvent)]
        shell = [e for e in inner if isinstance(e, ToolRow) and e.tool.name == "shell"]
        assert shell[-1].tool.status is ToolStatus.FAILED
        assert shell[-1].tool.output_text == "permission denied"
        texts = [e.text for e in events if isinstance(e, TextChunk)]
        assert texts == ["after"]
        assert events[-1].outcome.state is RunState.COMPLETED  # type: ignore[union-attr]
        await lease.release(close=True)


async def test_a_failed_child_is_its_parents_tool_result(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(lease, "/delegate T :: /fail broken\n/echo on")
        assert outcome.state is RunState.COMPLETED
        row = _delegate_row(events)
        assert row.tool.status is ToolStatus.FAILED
        assert row.tool.output_text == "the child session failed: broken"
        await lease.release(close=True)


async def test_a_child_cannot_delegate(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, _ = await run_prompt(lease, "/delegate T :: /delegate U :: deeper")
        inner = [e.event for e in events if isinstance(e, ChildEvent)]
        rows = [e for e in inner if isinstance(e, ToolRow) and e.tool.name == "delegate"]
        assert rows[-1].tool.status is ToolStatus.FAILED
        assert "cannot delegate" in (rows[-1].tool.output_text or "")
        assert len(await service.store.children(lease.task_id)) == 1
        await lease.release(close=True)


async def test_the_session_limit_fails_the_call_with_one_line(
    service: AgentService, project: Path
) -> None:
    script = "\n".join(f"/delegate T{n} :: /echo {n}" for n in range(MAX_SESSION_CHILDREN + 1))
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, _ = await run_prompt(lease, script)
        rows = {
            e.tool_id: e for e in events if isinstance(e, ToolRow) and e.tool.name == "delegate"
        }
        finals = [row.tool for row in rows.values()]
        assert [t.status for t in finals].count(ToolStatus.COMPLETED) == MAX_SESSION_CHILDREN
        assert finals[-1].status is ToolStatus.FAILED
        assert finals[-1].output_text == (
            f"this session has started {MAX_SESSION_CHILDREN} child sessions, its limit"
        )
        assert len(await service.store.children(lease.task_id)) == MAX_SESSION_CHILDREN
        await lease.release(close=True)


async def test_cancelling_a_child_alone_lets_its_parent_go_on(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/delegate T :: /hang\n/echo parent goes on")
        events: list[RunEvent] = []
        async for event in run.events():
            events.append(event)
            if isinstance(event, ChildRunning):
                await trio.testing.wait_all_tasks_blocked()
                assert lease.running_children == (event.child_id,)
                assert lease.cancel_child(event.child_id)
        ended = next(e for e in events if isinstance(e, ChildEnded))
        assert ended.outcome.state is RunState.CANCELLED
        assert [e.text for e in events if isinstance(e, TextChunk)] == ["parent goes on"]
        assert (await run.wait()).state is RunState.COMPLETED
        assert not lease.cancel_child(ended.child_id)
        await lease.release(close=True)


async def test_cancelling_the_parent_cancels_its_child(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/delegate T :: /hang")
        events: list[RunEvent] = []
        async for event in run.events():
            events.append(event)
            if isinstance(event, ChildRunning):
                run.cancel()
        ended = next(e for e in events if isinstance(e, ChildEnded))
        assert ended.outcome.state is RunState.CANCELLED
        assert events.index(ended) < len(events) - 1
        assert (await run.wait()).state is RunState.CANCELLED
        assert lease.running_children == ()
        await lease.release(close=True)


async def test_a_child_is_refused_alone_and_deleted_with_its_parent(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        await run_prompt(lease, "/delegate T :: /echo hi")
        (child,) = await service.store.children(lease.task_id)
        await lease.release(close=True)
        with pytest.raises(RuntimeRejection) as loaded:
            await nursery.start(service.serve_task, child.id, str(project))
        assert loaded.value.kind is RejectionKind.CHILD_SESSION
        assert loaded.value.message == "a child session: use its parent"
        with pytest.raises(RuntimeRejection) as deleted:
            await service.delete_task(child.id)
        assert deleted.value.kind is RejectionKind.CHILD_SESSION
        await service.delete_task(lease.task_id)
        assert await service.store.get_task(child.id) is None


async def test_a_fork_copies_the_children_it_holds_under_new_ids(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        await run_prompt(lease, "/delegate A :: /echo from a")
        await run_prompt(lease, "/delegate B :: /echo from b")
        sources = await service.store.children(lease.task_id)
        whole = await nursery.start(
            functools.partial(service.fork_task, lease.task_id, cwd=str(project))
        )
        copies = await service.store.children(whole.task_id)
        assert [c.title for c in copies] == ["A", "B"]
        assert not {c.id for c in copies} & {c.id for c in sources}
        assert {c.parent_id for c in copies} == {whole.task_id}
        texts = [[i.text for i in await service.store.history(c.id)] for c in copies]
        assert texts == [["/echo from a", "from a"], ["/echo from b", "from b"]]
        # A fork up to the first delegation's call holds that delegation only.
        history = await service.store.history(lease.task_id)
        up_to = next(i for i in history if i.tool is not None).item_id
        part = await nursery.start(
            functools.partial(service.fork_task, lease.task_id, cwd=str(project), up_to=up_to)
        )
        assert [c.title for c in await service.store.children(part.task_id)] == ["A"]
        for held in (part, whole, lease):
            await held.release(close=True)


class FanOut(Backend):
    """A parent turn delegates five tasks at once, each to a child that waits to be
    cancelled."""

    async def run_turn(self, turn: Turn) -> None:
        if turn.delegated:
            await trio.sleep_forever()
        results: list[DelegationResult] = []

        async def one(n: int) -> None:
            results.append(await turn.delegate(f"call-{n}", f"T{n}", "hang"))

        async with trio.open_nursery() as nursery:
            for n in range(5):
                nursery.start_soon(one, n)
        await turn.send_text(" ".join(sorted(r.state.value for r in results)))


async def test_a_waiting_child_runs_only_once_a_place_is_free_and_may_be_cancelled(
    tmp_path: Path, project: Path
) -> None:
    async with demo_service(tmp_path, backend=FanOut()) as service, trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("fan out")
        announced: list[str] = []
        running: list[str] = []
        events: list[RunEvent] = []
        cancelled = False
        async for event in run.events():
            events.append(event)
            if isinstance(event, ChildAnnounced):
                announced.append(event.child_id)
            elif isinstance(event, ChildRunning):
                running.append(event.child_id)
            if len(announced) == 5 and len(running) == MAX_RUNNING_CHILDREN and not cancelled:
                # The fifth waits: announced, not running; a cancel ends its wait.
                (waiting,) = set(announced) - set(running)
                assert len(lease.running_children) == MAX_RUNNING_CHILDREN
                assert waiting not in lease.running_children
                for child in (waiting, *running):
                    assert lease.cancel_child(child)
                cancelled = True
        ended = {e.child_id: e.outcome.state for e in events if isinstance(e, ChildEnded)}
        assert set(ended) == set(announced)
        assert set(ended.values()) == {RunState.CANCELLED}
        assert len(running) == MAX_RUNNING_CHILDREN
        assert [e.text for e in events if isinstance(e, TextChunk)] == [" ".join(["cancelled"] * 5)]
        await lease.release(close=True)


async def test_a_child_runs_on_the_hosts_subagent_model(tmp_path: Path, project: Path) -> None:
    async with temp_store(tmp_path) as store:
        service = AgentService(
            store=store,
            backend=DemoBackend(),
            catalog=demo_catalog(),
            policy=demo_policy(),
            subagent_model="demo-echo-large",
        )
        async with service, trio.open_nursery() as nursery:
            service.sign_in(DEMO_ACCOUNT)
            lease = await nursery.start(service.serve_new_task, str(project))
            await run_prompt(lease, "/delegate T :: /echo hi")
            (child,) = await store.children(lease.task_id)
            assert child.model == "demo-echo-large"
            assert lease.task.model != child.model
            await lease.release(close=True)


async def test_a_child_inherits_the_mode_and_its_shell_is_refused_in_ask(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        await lease.set_mode("ask")
        events, outcome = await run_prompt(lease, "/delegate T :: look")
        assert outcome.state is RunState.COMPLETED
        inner = [e.event for e in events if isinstance(e, ChildEvent)]
        # Nobody is asked: the mode refuses the child's shell call as it would its parent's.
        assert not [e for e in inner if isinstance(e, PermissionRequest)]
        shell = [e.tool for e in inner if isinstance(e, ToolRow) and e.tool.name == "shell"]
        assert shell[-1].status is ToolStatus.FAILED
        (child,) = await service.store.children(lease.task_id)
        assert child.mode == "ask"
        await lease.release(close=True)
