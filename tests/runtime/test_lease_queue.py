"""The prompt queue of a lease, as a host's own window uses it (no ACP): prompts wait their
turn first in first out behind a running prompt, each handed the slot in the step that frees
it; at most ``MAX_QUEUED_PROMPTS`` wait; withdrawn ones (one, all, or by revocation) admit
nothing and are numbered in the order they were withdrawn; every change is a ``QueueChanged``
session event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from maple_acp.model import ItemKind
from maple_acp.runtime import (
    MAX_PREVIEW_CHARS,
    MAX_QUEUED_PROMPTS,
    PromptClaim,
    QueueChanged,
    RejectionKind,
    RuntimeRejection,
    SessionLease,
    Turn,
    TurnResult,
    Withdrawn,
)
from maple_acp.testing.demo import demo_service


class Gated:
    """A backend whose turn for a prompt starting with ``wait`` waits for ``go``; it records
    the prompts it ran."""

    def __init__(self) -> None:
        self.go = trio.Event()
        self.waiting = trio.Event()
        self.ran: list[str] = []

    async def run_turn(self, turn: Turn) -> TurnResult | None:
        self.ran.append(turn.prompt)
        if turn.prompt.startswith("wait"):
            self.waiting.set()
            await self.go.wait()
        return None


@asynccontextmanager
async def lease_over(tmp_path: Path, backend: object) -> AsyncIterator[SessionLease]:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    async with (
        demo_service(data, backend=backend) as service,  # type: ignore[arg-type]
        trio.open_nursery() as nursery,
    ):
        lease: SessionLease = await nursery.start(service.serve_new_task, str(project))
        yield lease
        await lease.release(close=True)


async def users(lease: SessionLease) -> list[str]:
    return [item.text for item in await lease.history() if item.kind is ItemKind.USER]


class Outcomes(list[str]):
    """What each prompt came to, in the order they came; ``reached(n)`` waits for ``n``."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = trio.Event()

    def append(self, outcome: str) -> None:
        super().append(outcome)
        self._changed.set()
        self._changed = trio.Event()

    async def reached(self, count: int) -> None:
        with trio.fail_after(10):
            while len(self) < count:
                await self._changed.wait()


async def prompt_through_queue(
    lease: SessionLease,
    text: str,
    outcomes: Outcomes,
    window: object = None,
    *,
    task_status: trio.TaskStatus[None],
) -> None:
    """A host's prompt: wait in the queue, then run (or record that it was withdrawn)."""
    async with lease.queue_prompt(text, decided=task_status.started, window=window) as claim:
        if isinstance(claim, Withdrawn):
            outcomes.append(f"withdrawn {text} #{claim.order}")
            return
        assert isinstance(claim, PromptClaim)
        run = await lease.start_run(text, claim=claim)
        await run.wait()
        outcomes.append(f"ran {text}")


async def test_prompts_wait_in_order_and_enter_history_only_when_they_run(
    tmp_path: Path,
) -> None:
    backend = Gated()
    async with lease_over(tmp_path, backend) as lease, trio.open_nursery() as nursery:
        outcomes = Outcomes()
        events = lease.session_events()
        for text in ("wait first", "second", "third"):
            await nursery.start(prompt_through_queue, lease, text, outcomes)
        await trio.testing.wait_all_tasks_blocked()
        assert [entry.preview for entry in lease.queued_prompts] == ["second", "third"]
        assert await users(lease) == ["wait first"]
        # The slot is held while prompts wait: nothing claims it past them.
        with pytest.raises(RuntimeRejection) as taken, lease.claim_prompt():
            pass
        assert taken.value.kind is RejectionKind.RUN_ACTIVE
        backend.go.set()
        await outcomes.reached(3)
        assert outcomes == ["ran wait first", "ran second", "ran third"]
        assert backend.ran == ["wait first", "second", "third"]
        assert await users(lease) == ["wait first", "second", "third"]
        assert lease.queued_prompts == ()
        # The changes coalesce for a reader that lags; the latest one is the empty queue.
        changes = []
        while (event := await events.__anext__()) is not None:
            if isinstance(event, QueueChanged):
                changes.append([entry.preview for entry in event.entries])
                if not event.entries:
                    break
        assert changes[-1] == []


async def test_the_queue_holds_at_most_its_limit(tmp_path: Path) -> None:
    backend = Gated()
    async with lease_over(tmp_path, backend) as lease, trio.open_nursery() as nursery:
        outcomes = Outcomes()
        await nursery.start(prompt_through_queue, lease, "wait", outcomes)
        for n in range(MAX_QUEUED_PROMPTS):
            await nursery.start(prompt_through_queue, lease, f"p{n}", outcomes)
        with pytest.raises(RuntimeRejection) as full:
            await nursery.start(prompt_through_queue, lease, "one too many", outcomes)
        assert full.value.kind is RejectionKind.RUN_ACTIVE
        assert str(MAX_QUEUED_PROMPTS) in full.value.message
        assert len(lease.queued_prompts) == MAX_QUEUED_PROMPTS
        # Withdrawn in queue order, numbered so; nothing of them admitted.
        assert lease.cancel_queued() == MAX_QUEUED_PROMPTS
        await outcomes.reached(MAX_QUEUED_PROMPTS)
        assert sorted(outcomes, key=lambda o: int(o.split("#")[1])) == [
            f"withdrawn p{n} #{n + 1}" for n in range(MAX_QUEUED_PROMPTS)
        ]
        backend.go.set()
    assert backend.ran == ["wait"]


async def test_remove_takes_one_and_a_revocation_withdraws_the_rest(tmp_path: Path) -> None:
    backend = Gated()
    async with lease_over(tmp_path, backend) as lease, trio.open_nursery() as nursery:
        outcomes = Outcomes()
        await nursery.start(prompt_through_queue, lease, "wait", outcomes)
        for text in ("a", "b", "c"):
            await nursery.start(prompt_through_queue, lease, text, outcomes)
        b = lease.queued_prompts[1]
        assert b.preview == "b"
        assert lease.remove_queued(b.entry_id)
        assert not lease.remove_queued(b.entry_id)
        await outcomes.reached(1)
        assert outcomes == ["withdrawn b #1"]
        await backend.waiting.wait()
        lease.revoke("gone")
        await outcomes.reached(3)
        # Numbered in queue order (Trio wakes them in an order of its own).
        assert sorted(outcomes[1:]) == ["withdrawn a #2", "withdrawn c #3"]
        assert lease.queued_prompts == ()
    assert backend.ran == ["wait"]


class Window:
    """A window prompts come from (the edge passes its session)."""


async def test_each_window_numbers_its_own_withdrawn_prompts(tmp_path: Path) -> None:
    backend = Gated()
    desk, phone = Window(), Window()
    async with lease_over(tmp_path, backend) as lease, trio.open_nursery() as nursery:
        outcomes = Outcomes()
        await nursery.start(prompt_through_queue, lease, "wait", outcomes, desk)
        for text, window in (("a", desk), ("b", phone), ("c", desk), ("d", phone)):
            await nursery.start(prompt_through_queue, lease, text, outcomes, window)
        await backend.waiting.wait()
        assert lease.cancel_queued() == 4
        await outcomes.reached(4)
        # A window answers its own in order and never waits for another window's.
        assert sorted(outcomes) == [
            "withdrawn a #1",
            "withdrawn b #1",
            "withdrawn c #2",
            "withdrawn d #2",
        ]
        backend.go.set()
        await outcomes.reached(5)


async def test_a_preview_is_one_bounded_line(tmp_path: Path) -> None:
    backend = Gated()
    async with lease_over(tmp_path, backend) as lease, trio.open_nursery() as nursery:
        outcomes = Outcomes()
        await nursery.start(prompt_through_queue, lease, "wait", outcomes)
        long = "first line\n\nsecond " + "x" * 10_000_000
        await nursery.start(prompt_through_queue, lease, long, outcomes)
        (entry,) = lease.queued_prompts
        assert entry.preview.startswith("first line second xxx")
        assert len(entry.preview) <= MAX_PREVIEW_CHARS
        assert "\n" not in entry.preview
        assert lease.cancel_queued() == 1
        backend.go.set()


async def test_a_caller_that_stops_waiting_leaves_the_queue(tmp_path: Path) -> None:
    backend = Gated()
    async with lease_over(tmp_path, backend) as lease, trio.open_nursery() as nursery:
        outcomes = Outcomes()
        await nursery.start(prompt_through_queue, lease, "wait", outcomes)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as waiting:
                await waiting.start(prompt_through_queue, lease, "given up", outcomes)
                await nursery.start(prompt_through_queue, lease, "kept", outcomes)
                scope.cancel()
        assert [entry.preview for entry in lease.queued_prompts] == ["kept"]
        backend.go.set()
        await outcomes.reached(2)
        assert outcomes == ["ran wait", "ran kept"]
    assert backend.ran == ["wait", "kept"]
