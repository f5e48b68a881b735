"""A rate limit that resets past the retry bound: waited out (in virtual time) up to
``max_rate_limit_wait`` after a warning naming the retry time, then retried; a later reset
fails the turn with one line naming it; a cancel ends the wait at once. The rules on their
own, then through the real runtime, SDK and loopback provider."""

from __future__ import annotations

import datetime
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from loopback import LoopbackProvider, error_reply, text_reply
from provider_support import open_lease, provider_service

from maple_acp.backends import ProviderConfigError, load_provider_config
from maple_acp.backends.provider import SLOW_ANSWER_NOTICE_S, RequestTimeouts
from maple_acp.backends.provider._faults import ProviderFault, retrying, status_fault
from maple_acp.cli import provider_engine
from maple_acp.config import ConfigFileError, parse_config
from maple_acp.runtime import AgentService, RunNotice, RunOutcome, RunState, TextChunk
from maple_acp.testing.clock import ClockHoldingStore

#: ``HH:MM:SS UTC (in N s)`` as the notice and the failure line write a reset.
RESET = re.compile(r"(\d\d):(\d\d):(\d\d) UTC \(in (\d+) s\)")
#: The loopback turns jump the clock by hand; the SDK's own timeouts must never be reached.
PATIENT = RequestTimeouts(connect=10_000, read=10_000, write=10_000, pool=10_000)


def assert_names_reset_in(text: str, seconds: int) -> None:
    """``text`` names a wall-clock reset ``seconds`` from now (UTC, within a minute)."""
    found = RESET.search(text)
    assert found is not None, text
    assert int(found[4]) == seconds
    named = int(found[1]) * 3600 + int(found[2]) * 60 + int(found[3])
    now = datetime.datetime.now(datetime.UTC)
    expected = (now.hour * 3600 + now.minute * 60 + now.second + seconds) % 86_400
    assert min(abs(named - expected), 86_400 - abs(named - expected)) <= 60


def raw(**top: Any) -> dict[str, Any]:
    return {"providers": [{"name": "p", "base_url": "http://h/v1", "models": ["m"]}], **top}


# -- configuration ---------------------------------------------------------------------------


def test_max_rate_limit_wait_defaults_to_900_and_is_read_as_written() -> None:
    assert load_provider_config(raw(), "f").max_rate_limit_wait == 900
    assert load_provider_config(raw(max_rate_limit_wait=0), "f").max_rate_limit_wait == 0
    assert load_provider_config(raw(max_rate_limit_wait=60.5), "f").max_rate_limit_wait == 60.5


@pytest.mark.parametrize("value", [-1, True, "900", 86_401, float("nan"), float("inf")])
def test_a_bad_max_rate_limit_wait_is_one_line_naming_the_key(value: Any, tmp_path: Path) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw(max_rate_limit_wait=value), "f")
    assert str(caught.value).startswith("f: max_rate_limit_wait: must be a number of seconds")
    assert "\n" not in str(caught.value)
    # The file is refused when read, whichever engine would run.
    path = tmp_path / "config.toml"
    text = f"max_rate_limit_wait = {value!r}".replace("True", "true").replace("'", '"')
    with pytest.raises(ConfigFileError, match="max_rate_limit_wait: must be a number"):
        parse_config(text + "\n", path)


def test_the_file_wait_reaches_a_provider_built_from_flags_and_alone_means_the_demo(
    tmp_path: Path,
) -> None:
    config = parse_config("max_rate_limit_wait = 120\n", tmp_path / "config.toml")
    assert config.providers == {"max_rate_limit_wait": 120}
    # No provider configured: the demo engine, not a "no [[providers]]" error.
    assert provider_engine(config, None, None, None) is None
    engine = provider_engine(config, "http://127.0.0.1:9/v1", "m", None)
    assert engine is not None
    backend, _, _ = engine()
    assert backend._config.max_rate_limit_wait == 120


# -- the rules, in virtual time --------------------------------------------------------------


def test_a_429_and_an_overload_may_be_waited_out_a_server_error_not() -> None:
    assert status_fault(429, {"retry-after": "120"}, None, "m").resets_late()
    overloaded = status_fault(529, {"retry-after": "60"}, None, "m")
    assert overloaded.line == "the provider is overloaded (HTTP 529)"
    assert overloaded.resets_late()
    assert status_fault(503, {"retry-after": "60"}, {"type": "overloaded_error"}, "m").resets_late()
    assert not status_fault(503, {"retry-after": "60"}, None, "m").resets_late()
    assert not status_fault(429, {"retry-after": "20"}, None, "m").resets_late()


async def test_a_late_reset_is_waited_out_then_retried(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    calls: list[float] = []

    async def attempt() -> str:
        calls.append(trio.current_time())
        if len(calls) == 1:
            raise ProviderFault("limited", retryable=True, retry_after=120, rate_limited=True)
        return "ok"

    told: list[str] = []

    async def notify(line: str) -> None:
        told.append(line)

    assert await retrying(attempt, notify=notify, max_rate_limit_wait=900) == "ok"
    assert calls[1] - calls[0] == pytest.approx(120)
    assert len(told) == 1
    assert told[0].startswith("limited; retrying at ")
    assert_names_reset_in(told[0], 120)


async def test_late_resets_together_stay_within_the_maximum(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    count = 0

    async def attempt() -> str:
        nonlocal count
        count += 1
        raise ProviderFault("limited", retryable=True, retry_after=500, rate_limited=True)

    with pytest.raises(ProviderFault) as caught:
        await retrying(attempt, max_rate_limit_wait=900)
    # 500 s fits in 900; a second 500 s would not.
    assert count == 2
    assert trio.current_time() == pytest.approx(500)
    assert caught.value.line.startswith("limited; gave up after 1 retry: the limit resets at ")
    assert caught.value.line.endswith("past max_rate_limit_wait (900 s)")


# -- through the runtime and a real provider -------------------------------------------------


@pytest.fixture
async def patient_service(
    tmp_path: Path, provider: LoopbackProvider, request: pytest.FixtureRequest
) -> AsyncIterator[AgentService]:
    max_wait = getattr(request, "param", None)
    async with provider_service(
        tmp_path,
        provider,
        timeouts=PATIENT,
        max_rate_limit_wait=max_wait,
        hold_clock=ClockHoldingStore,
    ) as service:
        yield service


async def turn_through_a_wait(
    service: AgentService,
    project: Path,
    clock: trio.testing.MockClock,
    *,
    cancel: bool = False,
) -> tuple[list[Any], RunOutcome, float]:
    """One turn; at its first warning (or its end) the clock is moved by hand (a second at a
    time, once every task is blocked and no store call is in its thread: the store is a
    ``ClockHoldingStore``) until the run ends, or the run is cancelled. Returns the events,
    the outcome and the virtual seconds from the warning to the first answer text (or, with
    no answer, to the end)."""
    store = service.store
    assert isinstance(store, ClockHoldingStore)
    answered: list[float] = []
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("hi")
        events: list[Any] = []
        warned = trio.Event()

        async def watch() -> None:
            async for event in run.events():
                events.append(event)
                if isinstance(event, TextChunk):
                    answered.append(trio.current_time())
                if isinstance(event, RunNotice) and event.level == "warning":
                    warned.set()
            # A run that ends unwarned must fail the test, not hang it.
            warned.set()

        async with trio.open_nursery() as inner:
            inner.start_soon(watch)
            await warned.wait()
            start = trio.current_time()
            await store.settled()
            if cancel:
                run.cancel()
            else:
                # A step waits for the store's calls (a task waiting for the store's thread
                # counts as blocked), so no second passes while the run still works; a run
                # that has not ended by the last step is cancelled.
                for _ in range(1000):
                    if run.ended:
                        break
                    clock.jump(1)
                    await store.settled()
                # A run still waiting must fail the test, not hang it.
                run.cancel()
        outcome = await run.wait()
        waited = (answered[0] if answered else trio.current_time()) - start
        await lease.release(close=False)
    return events, outcome, waited


async def test_a_429_resetting_in_two_minutes_is_waited_out_with_a_notice(
    patient_service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    mock_clock: trio.testing.MockClock,
) -> None:
    provider.add(error_reply(429, "slow down", retry_after="120"), text_reply("finally"))
    events, outcome, waited = await turn_through_a_wait(patient_service, project, mock_clock)
    assert outcome.state is RunState.COMPLETED
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "finally"
    [warning] = [e for e in events if isinstance(e, RunNotice)]
    assert warning.text.startswith(
        "the provider is limiting the rate of requests (HTTP 429); retrying at "
    )
    assert_names_reset_in(warning.text, 120)
    # A wait is what the agent goes through: a client without notices sees it as a thought.
    assert warning.fallback == "thought"
    # Not retried a moment before the reset; answered within a tick after it.
    assert 120 <= waited <= 121
    assert len(provider.chat_requests()) == 2


@pytest.mark.parametrize("patient_service", [900], indirect=True)
async def test_a_reset_past_the_maximum_fails_the_turn_naming_the_reset_time(
    patient_service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    mock_clock: trio.testing.MockClock,
) -> None:
    provider.add(error_reply(429, "much later", retry_after="2000"))
    events, outcome, _ = await turn_through_a_wait(patient_service, project, mock_clock)
    assert trio.current_time() == 0
    assert not [e for e in events if isinstance(e, RunNotice) and e.level == "warning"]
    assert outcome.state is RunState.FAILED
    assert outcome.failure is not None
    assert outcome.failure.startswith(
        "the provider is limiting the rate of requests (HTTP 429); not retried: the limit resets"
    )
    assert outcome.failure.endswith("past max_rate_limit_wait (900 s)")
    assert_names_reset_in(outcome.failure, 2000)
    assert len(provider.chat_requests()) == 1


@pytest.mark.parametrize("patient_service", [0], indirect=True)
async def test_a_maximum_of_zero_never_waits_past_the_retry_bound(
    patient_service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    mock_clock: trio.testing.MockClock,
) -> None:
    provider.add(error_reply(429, "later", retry_after="120"), text_reply("never"))
    events, outcome, _ = await turn_through_a_wait(patient_service, project, mock_clock)
    assert trio.current_time() == 0
    assert not [e for e in events if isinstance(e, RunNotice) and e.level == "warning"]
    assert outcome.state is RunState.FAILED
    assert outcome.failure is not None
    assert outcome.failure.endswith("past max_rate_limit_wait (0 s)")
    assert len(provider.chat_requests()) == 1


async def test_a_cancel_during_the_wait_ends_the_turn_at_once(
    patient_service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    mock_clock: trio.testing.MockClock,
) -> None:
    provider.add(error_reply(429, "slow down", retry_after="600"), text_reply("never"))
    _, outcome, waited = await turn_through_a_wait(
        patient_service, project, mock_clock, cancel=True
    )
    assert outcome.state is RunState.CANCELLED
    assert waited == 0
    assert len(provider.chat_requests()) == 1


async def test_a_provider_silent_past_five_seconds_is_named_to_the_client_once(
    patient_service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    mock_clock: trio.testing.MockClock,
) -> None:
    held = trio.Event()
    slow = text_reply("late but here")
    slow.hold = held
    provider.add(slow)
    async with trio.open_nursery() as nursery:
        lease = await open_lease(patient_service, project, nursery)
        run = await lease.start_run("hi")
        events: list[Any] = []

        async def watch() -> None:
            async for event in run.events():
                events.append(event)

        nursery.start_soon(watch)
        await provider.streaming.wait()
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
            f"waiting for the provider at http://127.0.0.1:{provider.port}: no answer after 5 s"
        )
        held.set()
        outcome = await run.wait()
        await lease.release(close=False)
    assert outcome.state is RunState.COMPLETED
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "late but here"
    assert len([e for e in events if isinstance(e, RunNotice)]) == 1
