"""A far rate-limit reset on the Messages engine: the turn fails at once with one line naming
the reset's date and time, not after three quick retries."""

from __future__ import annotations

import email.utils
import re
import time
from pathlib import Path

import pytest
import trio
from anthropic_support import messages_service
from messages_loopback import MessagesProvider, error_reply, text_reply

from maple_acp.runtime import RunState
from maple_acp.testing.demo import run_prompt

DATED_RESET = re.compile(r"resets at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in \d+ s\)")


@pytest.mark.parametrize(
    "value", ["100000", email.utils.formatdate(time.time() + 365 * 86_400, usegmt=True)]
)
async def test_a_far_reset_fails_the_turn_at_once_naming_it(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, value: str
) -> None:
    messages_provider.add(error_reply(429, "quota", retry_after=value), text_reply("never"))
    async with (
        messages_service(tmp_path, messages_provider) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(service.serve_new_task, str(project))
        with trio.fail_after(5):
            _, outcome = await run_prompt(lease, "hi")
        await lease.release(close=False)
    assert outcome.state is RunState.FAILED
    assert outcome.failure is not None
    assert DATED_RESET.search(outcome.failure) is not None, outcome.failure
    assert outcome.failure.endswith("past max_rate_limit_wait (900 s)")
    assert len(messages_provider.message_requests()) == 1
