"""The streaming hot path skips trio's per-event checkpoint; these pin what it still owes: a
cancelled run's backend stops at its next chunk, an outer cancellation stops it within
``EMIT_BATCH`` chunks, and a backend that only streams does not starve other tasks."""

from __future__ import annotations

import itertools
from pathlib import Path

import trio
import trio.testing

from maple_acp.runtime import RunState, TextChunk, Turn
from maple_acp.runtime._event_queue import EMIT_BATCH, RUN_EVENT_QUEUE, RunEventQueue
from maple_acp.testing.demo import demo_service


class EndlessStream:
    """A backend whose turn only streams text, never awaiting anything else."""

    def __init__(self) -> None:
        #: Chunks whose ``send_text`` returned.
        self.sent = 0
        self.sent_at_cancel: int | None = None

    async def run_turn(self, turn: Turn) -> None:
        while True:
            await turn.send_text("x")
            self.sent += 1


async def test_a_cancelled_run_sends_no_chunk_after_the_cancel(tmp_path: Path) -> None:
    backend = EndlessStream()
    async with demo_service(tmp_path, backend=backend) as service, trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(tmp_path))
        run = await lease.start_run("go")
        seen = 0
        async for event in run.events():
            if isinstance(event, TextChunk):
                seen += 1
                if seen == 3 * RUN_EVENT_QUEUE + 5:
                    backend.sent_at_cancel = backend.sent
                    run.cancel()
        outcome = await run.wait()
        await lease.release(close=True)
    assert outcome.state is RunState.CANCELLED
    assert backend.sent_at_cancel is not None
    # Mid-batch or not, the chunk after the cancel raised Cancelled instead of being queued.
    assert backend.sent == backend.sent_at_cancel


async def _stream_into(queue: RunEventQueue, counter: list[int]) -> None:
    while True:
        event = TextChunk("r", "m", "x")
        if not queue.offer(event):
            await queue.send(event)
        counter[0] += 1


async def _drain(queue: RunEventQueue) -> None:
    async for _ in queue.reader():
        pass


async def test_an_outer_cancellation_stops_a_streaming_sender_within_a_batch() -> None:
    queue = RunEventQueue()
    sent = [0]
    async with trio.open_nursery() as readers:
        readers.start_soon(_drain, queue)
        with trio.CancelScope() as outer:
            async with trio.open_nursery() as senders:
                senders.start_soon(_stream_into, queue, sent)
                while sent[0] < 5 * EMIT_BATCH + 7:
                    await trio.lowlevel.checkpoint()
                at_cancel = sent[0]
                outer.cancel()
        queue.close([])
    assert outer.cancelled_caught
    assert at_cancel > 0
    assert sent[0] - at_cancel <= EMIT_BATCH


async def test_a_streaming_sender_lets_other_tasks_run() -> None:
    queue = RunEventQueue()
    sent = [0]
    ticks_seen: list[int] = []

    async def ticker() -> None:
        # Each scheduler pass the sender allows lets this task run once.
        while True:
            ticks_seen.append(sent[0])
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, queue)
        nursery.start_soon(ticker)
        nursery.start_soon(_stream_into, queue, sent)
        while sent[0] < 20 * EMIT_BATCH:
            await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks_seen)]
    assert len(ticks_seen) >= 10
    # Trio may run the two tasks in either order within one pass, so two batches can fall
    # between the ticker's turns, never more.
    assert max(gaps) <= 2 * EMIT_BATCH


async def test_after_the_run_is_cancelled_the_next_chunk_raises_and_queues_nothing() -> None:
    # A cancel that lands while the backend itself is running (an overflow of a producer that
    # cannot wait, a permission answered inside its own task) must stop its very next chunk.
    queue = RunEventQueue()
    assert queue.offer(TextChunk("r", "m", "first"))
    with trio.CancelScope() as scope:
        scope.cancel()
        queue.run_cancelled()
        event = TextChunk("r", "m", "second")
        assert not queue.offer(event)
        await queue.send(event)
    assert scope.cancelled_caught
    queue.close([])
    assert [event.text async for event in queue.reader()] == ["first"]  # type: ignore[attr-defined]
