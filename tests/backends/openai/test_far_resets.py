"""A rate limit that resets far off (a day, a year) is a reset, not a missing header: past
``max_rate_limit_wait`` the turn fails at once, with one line naming the reset's date and time,
and is not retried. ``Retry-After: 0`` still waits a second before the retry. The rules in
virtual time, then through the real runtime, SDK and loopback provider."""

from __future__ import annotations

import datetime
import email.utils
import re
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from loopback import LoopbackProvider, error_reply, text_reply
from provider_support import one_turn, provider_service

from maple_acp.backends.provider._faults import (
    ProviderFault,
    retry_after_seconds,
    retrying,
    status_fault,
)
from maple_acp.runtime import RunState

#: A reset on another day, as a failure line names it.
DATED_RESET = re.compile(r"resets at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC \(in (\d+) s\)")
YEAR_S = 365 * 86_400


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def a_year_ahead() -> str:
    return email.utils.formatdate(time.time() + YEAR_S, usegmt=True)


def test_far_resets_are_read_and_nonsense_is_not() -> None:
    assert retry_after_seconds({"retry-after": "100000"}) == 100_000
    assert retry_after_seconds({"retry-after-ms": "100000000"}) == 100_000
    year = retry_after_seconds({"retry-after": a_year_ahead()})
    assert year is not None
    assert abs(year - YEAR_S) < 5
    assert retry_after_seconds({"retry-after": "0"}) == 0
    assert retry_after_seconds({"retry-after": "Thu, 01 Jan 2015 00:00:00 GMT"}) == 0
    for nonsense in ("-5", "nan", "inf", "soon", "1e999"):
        assert retry_after_seconds({"retry-after": nonsense}) is None, nonsense


@pytest.mark.parametrize("header", ["100000", "year"])
async def test_a_far_reset_is_not_retried_and_names_its_date(
    clock: trio.testing.MockClock, header: str
) -> None:
    value = a_year_ahead() if header == "year" else header
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        raise status_fault(429, {"retry-after": value}, None, "m")

    with pytest.raises(ProviderFault) as caught:
        await retrying(attempt, max_rate_limit_wait=900)
    assert attempts == 1
    assert trio.current_time() == 0
    line = caught.value.line
    assert line.startswith(
        "the provider is limiting the rate of requests (HTTP 429); not retried: the limit resets "
    )
    assert line.endswith(", past max_rate_limit_wait (900 s)")
    found = DATED_RESET.search(line)
    assert found is not None, line
    named = datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.UTC)
    expected = YEAR_S if header == "year" else 100_000
    assert abs(named.timestamp() - (time.time() + expected)) < 60
    assert abs(int(found[2]) - expected) <= 5


@pytest.mark.parametrize("headers", [{"retry-after": "0"}, {"retry-after-ms": "0"}])
async def test_retry_after_zero_still_waits_a_second(
    clock: trio.testing.MockClock, headers: dict[str, str]
) -> None:
    tries: list[float] = []

    async def attempt() -> str:
        tries.append(trio.current_time())
        if len(tries) == 1:
            raise status_fault(429, headers, None, "m")
        return "answered"

    assert await retrying(attempt, backoff=(0.0,)) == "answered"
    assert tries[1] - tries[0] >= 1.0


@pytest.mark.parametrize("header", ["100000", "year"])
async def test_a_turn_meeting_a_far_reset_fails_at_once_with_one_line(
    tmp_path: Path, provider: LoopbackProvider, project: Path, header: str
) -> None:
    value = a_year_ahead() if header == "year" else header
    provider.add(error_reply(429, "quota", retry_after=value), text_reply("never"))
    async with provider_service(tmp_path, provider) as service:
        with trio.fail_after(5):
            _, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.FAILED
    assert outcome.failure is not None
    assert DATED_RESET.search(outcome.failure) is not None, outcome.failure
    assert "not retried" in outcome.failure
    assert "gave up" not in outcome.failure
    assert len(provider.chat_requests()) == 1
