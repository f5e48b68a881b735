"""Waiting on a silent Messages provider: once it has sent nothing for five seconds (virtual
time), the client is told once, as a notice falling back to a thought, and the answer that
comes later still arrives whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from anthropic_support import messages_service
from messages_loopback import MessagesProvider, text_reply

from maple_acp.backends.provider import SLOW_ANSWER_NOTICE_S, RequestTimeouts
from maple_acp.runtime import RunNotice, RunState, SessionLease, TextChunk

#: The turn jumps the clock by hand; the SDK's own timeouts must never be reached.
PATIENT = RequestTimeouts(connect=10_000, read=10_000, write=10_000, pool=10_000)


async def test_a_silent_messages_provider_is_named_to_the_client_once(
    tmp_path: Path,
    messages_provider: MessagesProvider,
    project: Path,
    mock_clock: trio.testing.MockClock,
) -> None:
    held = trio.Event()
    slow = text_reply("late but here")
    slow.hold = held
    messages_provider.add(slow)
    async with (
        messages_service(tmp_path, messages_provider, timeouts=PATIENT) as service,
        trio.open_nursery() as nursery,
    ):
        lease: SessionLease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("hi")
        events: list[Any] = []

        async def watch() -> None:
            async for event in run.events():
                events.append(event)

        nursery.start_soon(watch)
        await messages_provider.streaming.wait()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(SLOW_ANSWER_NOTICE_S - 0.1)
        await trio.testing.wait_all_tasks_blocked()
        assert not [e for e in events if isinstance(e, RunNotice)]
        mock_clock.jump(0.2)
        await trio.testing.wait_all_tasks_blocked()
        [notice] = [e for e in events if isinstance(e, RunNotice)]
        assert notice.level == "info"
        assert notice.fallback == "thought"
        assert notice.text == (
            f"waiting for the provider at http://127.0.0.1:{messages_provider.port}: "
            "no answer after 5 s"
        )
        held.set()
        outcome = await run.wait()
        await lease.release(close=False)
    assert outcome.state is RunState.COMPLETED
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "late but here"
    assert len([e for e in events if isinstance(e, RunNotice)]) == 1
