"""Steering a running turn in the runtime: durable admission in order, delivery through
``Turn.steering()``, the follow-up turn for what a backend did not take, the waits around the
prompt slot, and the refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from runtime_helpers import next_event

from maple_acp.model import ItemKind, TimelineItem
from maple_acp.runtime import (
    MAX_WAITING_STEERS,
    AgentService,
    CycleStarted,
    PermissionRequest,
    RejectionKind,
    RunState,
    RuntimeRejection,
    SessionLease,
    SteeringOutcome,
    TextChunk,
    Turn,
    TurnFailed,
    TurnResult,
)
from maple_acp.testing.demo import demo_service


class Recording:
    """A backend that says ``before``, waits for ``go``, says ``after``; it reads steering
    only when ``reads`` is set. It records every turn's prompt, history and steering."""

    def __init__(self, *, reads: bool) -> None:
        self.reads = reads
        self.go = trio.Event()
        self.started = trio.Event()
        self.prompts: list[str] = []
        self.histories: list[list[str]] = []
        self.taken: list[str] = []

    async def run_turn(self, turn: Turn) -> TurnResult | None:
        self.prompts.append(turn.prompt)
        self.histories.append([item.text for item in turn.history])
        if len(self.prompts) > 1:
            return None
        await turn.send_text("before")
        self.started.set()
        await self.go.wait()
        if self.reads:
            self.taken.extend(item.text for item in turn.steering())
        await turn.send_text("after")
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


def texts(history: list[TimelineItem]) -> list[tuple[str, str]]:
    return [(item.kind.value, item.text) for item in history]


async def test_a_steer_is_admitted_in_order_and_taken_at_the_next_step(tmp_path: Path) -> None:
    backend = Recording(reads=True)
    async with lease_over(tmp_path, backend) as lease:
        run = await lease.start_run("do it")
        await backend.started.wait()
        assert await lease.steer("also this") is SteeringOutcome.INJECTED
        # Durable before the backend sees it, after what the run said so far.
        assert texts(await lease.history())[-2:] == [("assistant", "before"), ("user", "also this")]
        assert backend.taken == []
        backend.go.set()
        outcome = await run.wait()
        assert outcome.state is RunState.COMPLETED
        assert backend.taken == ["also this"]
        # Taken once: no follow-up turn.
        assert backend.prompts == ["do it"]
        assert texts(await lease.history()) == [
            ("user", "do it"),
            ("assistant", "before"),
            ("user", "also this"),
            ("assistant", "after"),
        ]


async def test_a_steer_the_backend_never_reads_is_the_next_turns_message(
    tmp_path: Path,
) -> None:
    backend = Recording(reads=False)
    async with lease_over(tmp_path, backend) as lease:
        run = await lease.start_run("do it")
        await backend.started.wait()
        assert await lease.steer("one") is SteeringOutcome.INJECTED
        assert await lease.steer("two") is SteeringOutcome.INJECTED
        backend.go.set()
        assert (await run.wait()).state is RunState.COMPLETED
        # One follow-up backend turn of the same run, with both as its message (in order), and
        # a history that holds the first turn but not that message.
        assert backend.prompts == ["do it", "one\n\ntwo"]
        assert backend.histories[1] == ["do it", "before", "after"]
        users = [item.text for item in await lease.history() if item.kind is ItemKind.USER]
        assert users == ["do it", "one", "two"]


async def test_a_cancelled_turn_keeps_its_steer_in_history_for_the_next_turn(
    tmp_path: Path,
) -> None:
    backend = Recording(reads=False)
    async with lease_over(tmp_path, backend) as lease:
        run = await lease.start_run("do it")
        await backend.started.wait()
        assert await lease.steer("late") is SteeringOutcome.INJECTED
        run.cancel()
        assert (await run.wait()).state is RunState.CANCELLED
        assert backend.prompts == ["do it"]
        second = await lease.start_run("next")
        await second.wait()
        assert backend.prompts == ["do it", "next"]
        assert "late" in backend.histories[1]


async def test_with_no_prompt_running_nothing_is_admitted(tmp_path: Path) -> None:
    async with lease_over(tmp_path, Recording(reads=True)) as lease:
        assert await lease.steer("hello") is SteeringOutcome.IDLE
        assert await lease.history() == []
        assert not lease.model_locked


async def test_a_steer_waits_for_a_claimed_prompt_then_steers_its_run(tmp_path: Path) -> None:
    backend = Recording(reads=True)
    async with lease_over(tmp_path, backend) as lease:
        outcomes: list[SteeringOutcome] = []
        with lease.claim_prompt() as claim:
            async with trio.open_nursery() as nursery:

                async def steer() -> None:
                    outcomes.append(await lease.steer("early"))

                nursery.start_soon(steer)
                await trio.testing.wait_all_tasks_blocked()
                assert outcomes == []
                run = await lease.start_run("do it", claim=claim)
        assert outcomes == [SteeringOutcome.INJECTED]
        backend.go.set()
        await run.wait()
        assert backend.taken == ["early"]


async def test_a_steer_after_a_cancel_waits_for_the_end_then_is_idle(tmp_path: Path) -> None:
    class Stubborn(Recording):
        async def run_turn(self, turn: Turn) -> TurnResult | None:
            self.started.set()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await self.go.wait()

    backend = Stubborn(reads=True)
    async with lease_over(tmp_path, backend) as lease:
        run = await lease.start_run("do it")
        await backend.started.wait()
        run.cancel()
        outcomes: list[SteeringOutcome] = []
        async with trio.open_nursery() as nursery:

            async def steer() -> None:
                outcomes.append(await lease.steer("after cancel"))

            nursery.start_soon(steer)
            await trio.testing.wait_all_tasks_blocked()
            # The cancelled run takes nothing; the steer waits for its end.
            assert outcomes == []
            backend.go.set()
        assert outcomes == [SteeringOutcome.IDLE]
        users = [item.text for item in await lease.history() if item.kind is ItemKind.USER]
        assert users == ["do it"]


async def test_a_permission_wait_is_not_interrupted(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "data").mkdir()
    async with demo_service(tmp_path / "data") as service, trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run('/tool shell {"command": "echo hi"}\n/echo done')
        events = run.events()
        request = await next_event(events, PermissionRequest)
        assert await lease.steer("meanwhile") is SteeringOutcome.INJECTED
        # Still the same pending question, unanswered.
        assert run.pending_permissions == (request.responder.id,)
        assert request.responder.answer("allow_once")
        said = [event.text async for event in events if isinstance(event, TextChunk)]
        # Taken after the tool call it waited for, before the next line.
        assert said == ["steered: meanwhile", "done"]
        assert (await run.wait()).state is RunState.COMPLETED
        await lease.release(close=True)


async def test_too_many_waiting_steers_are_refused(tmp_path: Path) -> None:
    backend = Recording(reads=False)
    async with lease_over(tmp_path, backend) as lease:
        run = await lease.start_run("do it")
        await backend.started.wait()
        for index in range(MAX_WAITING_STEERS):
            assert await lease.steer(f"s{index}") is SteeringOutcome.INJECTED
        with pytest.raises(RuntimeRejection) as caught:
            await lease.steer("one more")
        assert caught.value.kind is RejectionKind.RUN_ACTIVE
        users = [item.text for item in await lease.history() if item.kind is ItemKind.USER]
        assert "one more" not in users
        backend.go.set()
        await run.wait()


async def test_a_goal_cycle_is_not_a_prompt_turn(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events = lease.session_events()
        await lease.set_goal("hang forever")
        with trio.fail_after(5):
            cycle = (await anext(e async for e in events if isinstance(e, CycleStarted))).run
        assert await lease.steer("hi") is SteeringOutcome.IDLE
        assert not cycle.ended
        await lease.release(close=True)


async def test_a_revoked_lease_refuses_steering(tmp_path: Path) -> None:
    async with lease_over(tmp_path, Recording(reads=True)) as lease:
        lease.revoke()
        with pytest.raises(RuntimeRejection) as caught:
            await lease.steer("hi")
        assert caught.value.kind is RejectionKind.LEASE_REVOKED


async def test_a_failed_turn_takes_no_follow_up(tmp_path: Path) -> None:
    class Failing(Recording):
        async def run_turn(self, turn: Turn) -> TurnResult | None:
            self.prompts.append(turn.prompt)
            self.started.set()
            await self.go.wait()
            raise TurnFailed("it broke")

    backend = Failing(reads=False)
    async with lease_over(tmp_path, backend) as lease:
        run = await lease.start_run("do it")
        await backend.started.wait()
        assert await lease.steer("more") is SteeringOutcome.INJECTED
        backend.go.set()
        assert (await run.wait()).state is RunState.FAILED
        assert backend.prompts == ["do it"]
        users = [item.text for item in await lease.history() if item.kind is ItemKind.USER]
        assert users == ["do it", "more"]
        # The failed run takes nothing more: the next message finds no turn.
        assert await lease.steer("after") is SteeringOutcome.IDLE
