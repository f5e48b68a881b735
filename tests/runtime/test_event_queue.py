"""The run event queue on its own: order, backpressure, closing, batches."""

from __future__ import annotations

import trio
import trio.testing

from maple_acp.runtime import RunEvent, RunNotice
from maple_acp.runtime._event_queue import MAX_BATCH, RUN_EVENT_QUEUE, RunEventQueue


def notice(i: int) -> RunNotice:
    return RunNotice("r", str(i))


def texts(events: list[RunEvent]) -> list[str]:
    return [event.text for event in events if isinstance(event, RunNotice)]


async def test_a_full_queue_holds_the_sender_until_the_reader_takes() -> None:
    queue = RunEventQueue()
    for i in range(RUN_EVENT_QUEUE):
        await queue.send(notice(i))
    assert not queue.send_nowait(notice(-1))
    sent = trio.Event()

    async def one_more() -> None:
        await queue.send(notice(RUN_EVENT_QUEUE))
        sent.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one_more)
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set()
        reader = queue.reader()
        assert texts([await reader.__anext__()]) == ["0"]
        await trio.testing.wait_all_tasks_blocked()
        assert sent.is_set()
        queue.close([notice(-2)])
        rest = texts([event async for event in reader])
    assert rest == [str(i) for i in range(1, RUN_EVENT_QUEUE + 1)] + ["-2"]


async def test_a_cancelled_waiting_sender_queues_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue = RunEventQueue()
    for i in range(RUN_EVENT_QUEUE):
        queue.send_nowait(notice(i))
    with trio.move_on_after(1) as scope:
        await queue.send(notice(999))
    assert scope.cancelled_caught
    queue.close([])
    seen = texts([event async for event in queue.reader()])
    assert "999" not in seen
    assert len(seen) == RUN_EVENT_QUEUE


async def test_close_wakes_a_waiting_reader_and_drops_later_sends() -> None:
    queue = RunEventQueue()
    got: list[str] = []

    async def read() -> None:
        async for event in queue.reader():
            got.extend(texts([event]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await queue.send(notice(1))
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["1"]
        queue.close([notice(2)])
        await queue.send(notice(3))
        assert queue.send_nowait(notice(4))
    assert got == ["1", "2"]


async def test_batches_take_what_is_queued_then_the_tail() -> None:
    queue = RunEventQueue()
    for i in range(RUN_EVENT_QUEUE):
        queue.send_nowait(notice(i))
    queue.close([notice(-1), notice(-2)])
    batches = [batch async for batch in queue.batch_reader()]
    # A drained, closed queue's terminal events join the batch that drained it.
    assert [len(batch) for batch in batches] == [MAX_BATCH + 2]
    flat = texts([event for batch in batches for event in batch])
    assert flat == [str(i) for i in range(RUN_EVENT_QUEUE)] + ["-1", "-2"]


async def test_a_batch_holds_at_most_max_batch_queued_events() -> None:
    queue = RunEventQueue()
    reader = queue.batch_reader()
    for i in range(RUN_EVENT_QUEUE):
        queue.send_nowait(notice(i))
    first = await reader.__anext__()
    assert len(first) == MAX_BATCH
    queue.send_nowait(notice(RUN_EVENT_QUEUE))
    queue.close([notice(-1)])
    assert texts(await reader.__anext__()) == [str(RUN_EVENT_QUEUE), "-1"]
