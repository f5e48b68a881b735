"""Runs: admission, ordered events, stable ids, terminal state, usage, backpressure, overflow."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from runtime_helpers import of_type

from maple_acp.model import ItemKind, Usage
from maple_acp.runtime import (
    RUN_EVENT_QUEUE,
    AgentService,
    RejectionKind,
    RunEnded,
    RunNotice,
    RunState,
    RuntimeRejection,
    TextChunk,
    ThoughtChunk,
    TitleChanged,
    UsageUpdate,
)
from maple_acp.testing.demo import collect_events, run_prompt


async def test_events_arrive_in_order_with_stable_message_ids(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(
            lease, "first line\nsecond line\n/think pondering\n/echo after\n/title Named"
        )
        assert outcome.state is RunState.COMPLETED
        kinds = [type(event) for event in events]
        assert kinds == [TextChunk, ThoughtChunk, TextChunk, TitleChanged, RunEnded]
        texts = of_type(events, TextChunk)
        assert texts[0].text == "first line\nsecond line"
        assert texts[0].message_id != texts[1].message_id
        history = await lease.history()
        assert [item.kind for item in history] == [
            ItemKind.USER,
            ItemKind.ASSISTANT,
            ItemKind.THOUGHT,
            ItemKind.ASSISTANT,
        ]
        # The live ids are the history ids, so a replay and a live stream agree.
        assert history[1].item_id == texts[0].message_id
        assert history[3].text == "after"
        assert lease.task.title == "Named"
        await lease.release(close=True)


async def test_chunks_of_one_message_share_an_id_and_are_stored_joined(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, _ = await run_prompt(lease, "/stream 5 3")
        chunks = of_type(events, TextChunk)
        assert len(chunks) == 5
        assert len({chunk.message_id for chunk in chunks}) == 1
        history = await lease.history()
        assert history[-1].text == "x" * 15
        await lease.release(close=True)


async def test_one_active_prompt_per_task(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/hang")
        with pytest.raises(RuntimeRejection) as caught:
            await lease.start_run("again")
        assert caught.value.kind is RejectionKind.RUN_ACTIVE
        assert service.status().active_runs == 1
        run.cancel()
        outcome = await run.wait()
        assert outcome.state is RunState.CANCELLED
        events = await collect_events(run)
        assert isinstance(events[-1], RunEnded)
        # The task accepts a prompt again once the run ended.
        _, second = await run_prompt(lease, "again")
        assert second.state is RunState.COMPLETED
        await lease.release(close=True)


async def test_failed_run_text_is_an_event_before_its_end(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        long_reason = "bad " * 400 + "\nsecond line"
        events, outcome = await run_prompt(lease, f"/fail {long_reason}")
        assert outcome.state is RunState.FAILED
        assert outcome.failure is not None
        assert len(outcome.failure) <= 500
        assert "\n" not in outcome.failure
        notice, end = events[-2], events[-1]
        assert isinstance(notice, RunNotice)
        assert notice.terminal
        assert notice.text == outcome.failure
        assert isinstance(end, RunEnded)
        await lease.release(close=True)


async def test_usage_is_per_run_not_cumulative(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, first = await run_prompt(lease, "/usage 10 5\n/usage 1 1")
        assert first.usage == Usage(input_tokens=11, output_tokens=6, total_tokens=17)
        assert of_type(events, UsageUpdate)[-1].usage == first.usage
        _, second = await run_prompt(lease, "/usage 2 3")
        assert second.usage == Usage(input_tokens=2, output_tokens=3, total_tokens=5)
        _, third = await run_prompt(lease, "no usage at all")
        assert third.usage == Usage()
        await lease.release(close=True)


async def test_user_message_is_admitted_before_the_backend_runs(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/hang")
        history = await service.task_history(lease.task_id)
        assert [item.text for item in history] == ["/hang"]
        assert not lease.task.provisional
        run.cancel()
        await run.wait()
        await lease.release(close=True)


async def test_awaited_sends_wait_for_a_slow_reader(service: AgentService, project: Path) -> None:
    """Backpressure: a backend streaming far more than the queue holds is held back by the
    reader, and loses nothing."""
    total = RUN_EVENT_QUEUE * 8
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(f"/stream {total} 4")
        await trio.testing.wait_all_tasks_blocked()
        assert not run.ended
        events = await collect_events(run)
        outcome = await run.wait()
        assert outcome.state is RunState.COMPLETED
        assert not outcome.overflowed
        assert len(of_type(events, TextChunk)) == total
        await lease.release(close=True)


async def test_overflow_of_a_producer_that_cannot_wait_cancels_that_run_only(
    service: AgentService, project: Path, tmp_path: Path
) -> None:
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        other = await nursery.start(service.serve_new_task, str(other_dir))
        steady = await other.start_run("/stream 600 8")
        run = await lease.start_run(f"/burst {RUN_EVENT_QUEUE + 50} 8")
        outcome = await run.wait()
        assert outcome.state is RunState.CANCELLED
        assert outcome.overflowed
        events = await collect_events(run)
        # What fit in the queue is delivered, then the notice; nothing is reconstructed.
        assert len(of_type(events, TextChunk)) == RUN_EVENT_QUEUE
        notices = [e for e in of_type(events, RunNotice) if e.terminal]
        assert len(notices) == 1
        assert "cancelled" in notices[0].text
        assert isinstance(events[-1], RunEnded)
        steady_events = await collect_events(steady)
        assert (await steady.wait()).state is RunState.COMPLETED
        assert len(of_type(steady_events, TextChunk)) == 600
        await lease.release(close=True)
        await other.release(close=True)


async def test_a_burst_that_fits_is_delivered(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(lease, f"/burst {RUN_EVENT_QUEUE - 1} 2")
        assert outcome.state is RunState.COMPLETED
        assert len(of_type(events, TextChunk)) == RUN_EVENT_QUEUE - 1
        await lease.release(close=True)


async def test_events_can_be_read_only_once(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("hi")
        await collect_events(run)
        with pytest.raises(RuntimeError):
            run.events()
        await lease.release(close=True)


async def test_event_batches_carry_the_same_events_in_order(
    service: AgentService, project: Path
) -> None:
    from maple_acp.runtime import RunEnded, TextChunk, TitleChanged
    from maple_acp.runtime._event_queue import MAX_BATCH

    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        one_by_one = await lease.start_run("/stream 600 10\n/think done")
        singles = [event async for event in one_by_one.events()]
        batched_run = await lease.start_run("/stream 600 10\n/think done")
        batches_iter = batched_run.event_batches()
        with pytest.raises(RuntimeError):
            batched_run.events()
        # A slow consumer: the backend fills the queue before the first batch is taken.
        await trio.testing.wait_all_tasks_blocked()
        batches = [batch async for batch in batches_iter]
        await lease.release(close=True)
    flat = [event for batch in batches for event in batch]
    assert all(batch for batch in batches)
    assert max(len(batch) for batch in batches) > 1
    assert all(len(batch) <= MAX_BATCH + 3 for batch in batches)
    assert isinstance(flat[-1], RunEnded)
    # The first prompt run of the task also titled it; the second had nothing to title.
    singles = [e for e in singles if not isinstance(e, TitleChanged)]
    assert [type(e) for e in flat] == [type(e) for e in singles]
    texts = [e.text for e in flat if isinstance(e, TextChunk)]
    assert texts == [e.text for e in singles if isinstance(e, TextChunk)]
