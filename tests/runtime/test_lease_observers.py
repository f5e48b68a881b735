"""A lease's observers through the runtime alone (a host's own window): the snapshot and the
feed meet exactly, a question shared by every window is decided by the first clean answer,
and an observer is detached when it falls behind or its lease goes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given
from runtime_helpers import exists, next_event

from maple_acp.model import ItemKind
from maple_acp.runtime import (
    MAX_OBSERVERS,
    OBSERVER_BACKLOG,
    AgentService,
    ObservedEvent,
    Observer,
    ObserverDetached,
    PermissionAnswer,
    PermissionRequest,
    PermissionTicket,
    PromptAdmitted,
    PromptStarted,
    RejectionKind,
    RunBatch,
    RunEnded,
    RunEvent,
    RunState,
    RuntimeRejection,
    SessionLease,
    SharedQuestion,
    TextChunk,
)
from maple_acp.runtime._permissions import PermissionBroker


def touch(path: Path) -> str:
    return "/tool shell " + json.dumps({"command": f"touch {path}"})


async def queued(observer: Observer) -> list[ObservedEvent]:
    """What the observer's feed holds now, without waiting for more."""
    items: list[ObservedEvent] = []
    with trio.CancelScope() as now:
        now.cancel()  # a read that would wait ends the loop
        async for item in observer:
            items.append(item)
    return items


def events_of(items: list[ObservedEvent]) -> list[RunEvent]:
    return [event for item in items if isinstance(item, RunBatch) for event in item.events]


async def question(observer: Observer) -> PermissionRequest:
    with trio.fail_after(10):
        async for item in observer:
            if isinstance(item, RunBatch):
                for event in item.events:
                    if isinstance(event, PermissionRequest):
                        return event
    raise AssertionError("the feed ended without a question")


@pytest.fixture
async def lease(service: AgentService, project: Path) -> AsyncIterator[SessionLease]:
    async with trio.open_nursery() as nursery:
        held: SessionLease = await nursery.start(service.serve_new_task, str(project))
        yield held
        await held.release(close=True)


async def test_the_first_clean_answer_decides_and_a_later_one_changes_nothing(
    lease: SessionLease, project: Path
) -> None:
    marker = project / "ran"
    observer = lease.attach_observer()
    run = await lease.start_run(touch(marker))
    events = run.events()
    asked = await next_event(events, PermissionRequest)
    followed = await question(observer)
    assert isinstance(asked.responder, PermissionTicket)
    assert isinstance(followed.responder, PermissionTicket)
    assert followed.responder.id == asked.responder.id
    assert followed.responder.answer("allow_once")
    # The holder's answer after it neither decides nor fails anything closed.
    assert not asked.responder.answer("deny_once")
    assert asked.responder.settled.is_set()
    _ = [event async for event in events]
    assert (await run.wait()).state is RunState.COMPLETED
    assert exists(marker)


async def test_a_window_that_gives_up_leaves_the_question_to_the_others(
    lease: SessionLease, project: Path
) -> None:
    marker = project / "ran"
    observer = lease.attach_observer()
    run = await lease.start_run(touch(marker))
    events = run.events()
    asked = await next_event(events, PermissionRequest)
    followed = await question(observer)
    assert not asked.responder.answer(None)  # the holder's client said "cancelled"
    assert not run.ended
    assert run.pending_permissions
    assert followed.responder.answer("allow_once")
    _ = [event async for event in events]
    assert (await run.wait()).state is RunState.COMPLETED
    assert exists(marker)


async def test_when_every_window_gave_up_the_question_is_denied(
    lease: SessionLease, project: Path
) -> None:
    marker = project / "ran"
    observer = lease.attach_observer()
    run = await lease.start_run(touch(marker))
    events = run.events()
    asked = await next_event(events, PermissionRequest)
    await trio.testing.wait_all_tasks_blocked()
    # The observer goes before reading its question: its ticket is withdrawn with it.
    observer.detach()
    assert not asked.responder.answer(None)
    _ = [event async for event in events]
    assert (await run.wait()).state is RunState.CANCELLED
    assert not exists(marker)


async def test_a_window_attached_while_a_question_waits_gets_it(
    lease: SessionLease, project: Path
) -> None:
    marker = project / "ran"
    run = await lease.start_run(touch(marker))
    events = run.events()
    asked = await next_event(events, PermissionRequest)
    late = lease.attach_observer()
    followed = await question(late)
    assert followed.request == asked.request
    assert followed.responder.answer("deny_once")
    _ = [event async for event in events]
    assert (await run.wait()).state is RunState.COMPLETED
    assert not exists(marker)


async def test_the_snapshot_and_the_feed_meet_exactly(lease: SessionLease) -> None:
    run = await lease.start_run("/echo so far\n/hang")
    events = run.events()
    seen = await next_event(events, TextChunk)
    observer = lease.attach_observer()
    (snapshot,) = observer.snapshot
    assert snapshot.run_id == run.id
    assert [(i.kind, i.item_id, i.text) for i in snapshot.items] == [
        (ItemKind.ASSISTANT, seen.message_id, "so far")
    ]
    run.cancel()
    _ = [event async for event in events]
    feed = events_of(await queued(observer))
    assert not [e for e in feed if isinstance(e, TextChunk) and e.text == "so far"]
    assert isinstance(feed[-1], RunEnded)


async def test_an_observers_run_is_read_by_the_holder_and_shown_once_its_feed_handled_it(
    lease: SessionLease,
) -> None:
    events = lease.session_events()
    observer = lease.attach_observer()
    run = await lease.start_run("/echo from the phone")
    observer.hand_over(run, "/echo from the phone")
    with trio.fail_after(10):
        started = await anext(events)
        while not isinstance(started, PromptStarted):
            started = await anext(events)
    assert (started.run, started.text) == (run, "/echo from the phone")
    # The holder's side reads the run (its one reader); the window's feed gets every batch.
    _ = [event async for event in run.events()]
    assert (await run.wait()).state is RunState.COMPLETED
    shown = trio.Event()

    async def wait_shown() -> None:
        await observer.shown(run.id)
        shown.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_shown)
        items = await queued(observer)
        assert isinstance(items[0], PromptAdmitted)
        assert isinstance(events_of(items)[-1], RunEnded)
        await trio.testing.wait_all_tasks_blocked()
        # Handled once the window asked for what follows, and the holder showed it too.
        assert not shown.is_set()
        started.shown.set()
        with trio.fail_after(10):
            await shown.wait()


async def test_a_window_that_falls_behind_is_detached_and_the_run_goes_on(
    lease: SessionLease,
) -> None:
    observer = lease.attach_observer()  # never read
    run = await lease.start_run(f"/stream {OBSERVER_BACKLOG + 100} 1")
    _ = [event async for event in run.events()]
    assert (await run.wait()).state is RunState.COMPLETED
    assert lease.observers == 0
    items = await queued(observer)
    assert len(items) == 1
    assert isinstance(items[0], ObserverDetached)
    assert "behind" in items[0].reason


async def test_at_most_four_observers_and_none_once_the_lease_is_gone(
    lease: SessionLease,
) -> None:
    observers = [lease.attach_observer() for _ in range(MAX_OBSERVERS)]
    with pytest.raises(RuntimeRejection) as full:
        lease.attach_observer()
    assert full.value.kind is RejectionKind.OBSERVERS_FULL
    assert str(MAX_OBSERVERS) in full.value.message
    observers.pop().detach()
    observers.append(lease.attach_observer())
    lease.revoke()
    for observer in observers:
        assert observer.detached is not None
        (end,) = await queued(observer)
        assert isinstance(end, ObserverDetached)
    with pytest.raises(RuntimeRejection) as gone:
        lease.attach_observer()
    assert gone.value.kind is RejectionKind.LEASE_REVOKED


#: One window's move on a shared question: its answer, or ``cancel_run`` (the run ends).
_MOVES = st.lists(
    st.tuples(st.integers(0, MAX_OBSERVERS), st.sampled_from(["allow", "deny", "give_up", "end"])),
    max_size=12,
)


@given(windows=st.integers(1, MAX_OBSERVERS + 1), moves=_MOVES)
def test_exactly_one_answer_decides_a_shared_question(
    windows: int, moves: list[tuple[int, str]]
) -> None:
    """Whatever the windows do, in any order: at most one answer decides; the outcome is that
    answer; the question is denied and its run cancelled once every window gave up first; a
    second answer through one ticket fails closed."""
    cancelled: list[bool] = []
    broker = PermissionBroker("r1", lambda: cancelled.append(True))
    responder = broker.open_request()
    shared = SharedQuestion(responder)
    tickets = [shared.ticket() for _ in range(windows)]
    decided: list[str] = []
    gave_up: set[int] = set()
    for index, move in moves:
        ticket = tickets[index % windows]
        if move == "end":
            broker.close()
            continue
        reused = ticket.used
        answer = {"allow": PermissionAnswer.ALLOW_ONCE, "deny": PermissionAnswer.DENY_ONCE}.get(
            move
        )
        accepted = ticket.answer(answer)
        if reused:
            assert not accepted
            assert cancelled  # fails closed
            continue
        if accepted:
            decided.append(move)
        elif answer is None and not decided and not responder.done.is_set():
            gave_up.add(index % windows)
        if len(gave_up) == windows and not decided:
            assert responder.done.is_set()
            assert not responder.allowed
            assert cancelled
    assert len(decided) <= 1
    if decided:
        assert responder.done.is_set()
        assert responder.allowed == (decided[0] == "allow")
        assert shared.settled.is_set()
