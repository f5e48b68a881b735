"""The listener's refusal log: one INFO line per address and status in a minute, its repeats
at DEBUG and counted, and a bounded table. Sans-I/O on a fake clock, then a flood of 1,000
bad-token requests on a real loopback server."""

from __future__ import annotations

import logging

import pytest
from net_support import INITIALIZE, net_host, token_free, websocket_handshake

from maple_acp.net._guard import (
    MAX_LOGGED_REFUSERS,
    REFUSAL_LOG_WINDOW_S,
    RefusalLog,
    Repeats,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_refusal_of_an_address_and_status_is_logged_and_repeats_are_counted() -> None:
    clock = FakeClock()
    log = RefusalLog(clock)
    assert log.note("10.0.0.1", 401) == (True, [])
    for _ in range(999):
        clock.now += 0.01
        assert log.note("10.0.0.1", 401) == (False, [])
    # Another status of the same address, and another address, are firsts of their own.
    assert log.note("10.0.0.1", 429) == (True, [])
    assert log.note("10.0.0.2", 401) == (True, [])
    assert len(log) == 3
    # Past the window, the next refusal of the address is logged again, after the count of
    # the repeats of the window that ended.
    clock.now = 100.0 + REFUSAL_LOG_WINDOW_S
    first, ended = log.note("10.0.0.1", 401)
    assert first
    assert ended == [Repeats("10.0.0.1", 401, 999, pytest.approx(9.99))]


def test_an_ended_window_is_reported_at_the_next_refusal_of_any_address() -> None:
    clock = FakeClock()
    log = RefusalLog(clock, window_s=60.0)
    log.note("10.0.0.1", 401)
    log.note("10.0.0.1", 401)
    log.note("10.0.0.3", 403)  # no repeats: nothing to report when it ends
    clock.now += 59.0
    assert log.note("10.0.0.2", 421) == (True, [])
    clock.now += 1.0
    assert log.note("10.0.0.2", 421) == (False, [Repeats("10.0.0.1", 401, 1, 0.0)])
    # Reported once: the windows that ended are gone.
    assert log.note("10.0.0.2", 421) == (False, [])
    assert len(log) == 1


def test_the_table_is_bounded_and_a_forgotten_address_s_repeats_are_still_reported() -> None:
    clock = FakeClock()
    log = RefusalLog(clock)
    log.note("10.0.0.1", 401)
    log.note("10.0.0.1", 401)
    reported: list[Repeats] = []
    for n in range(10 * MAX_LOGGED_REFUSERS):
        clock.now += 0.001
        first, ended = log.note(f"10.1.{n // 256}.{n % 256}", 401)
        assert first
        reported.extend(ended)
        assert len(log) <= MAX_LOGGED_REFUSERS
    assert len(log) == MAX_LOGGED_REFUSERS
    # The oldest went first, with its one repeat; the others had none to report.
    assert reported == [Repeats("10.0.0.1", 401, 1, 0.0)]
    # A forgotten address is logged again.
    assert log.note("10.0.0.1", 401)[0]


async def test_a_flood_of_bad_tokens_logs_a_few_info_lines_and_never_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="maple_acp.net")
    bad = "Bearer not-the-token-0123456789abcdef"
    async with net_host() as host, host.client() as client:
        statuses: set[int] = set()
        for _ in range(1000):
            answer = await client.post(
                host.url,
                content=INITIALIZE,
                headers={"Content-Type": "application/json", "Authorization": bad},
            )
            statuses.add(answer.status_code)
        # A few 401s each second, then 429 once the address has failed ten times in one.
        assert statuses == {401, 429}
        # The WebSocket upgrade's refusals count with the requests'.
        for _ in range(3):
            upgrade = await websocket_handshake(host, headers={"Authorization": bad})
            assert upgrade.status in (401, 429)
    refusals = [r for r in caplog.records if "refused a request" in r.getMessage()]
    assert len(refusals) == 1000  # every one is still logged, the repeats at DEBUG
    info = [r.getMessage() for r in refusals if r.levelno >= logging.INFO]
    assert info == [
        "refused a request from 127.0.0.1 (401): a missing or wrong bearer token",
        "refused a request from 127.0.0.1 (429): too many failed authentications from one address",
    ]
    upgrades = [r for r in caplog.records if "refused a WebSocket" in r.getMessage()]
    assert [r.levelno for r in upgrades] == [logging.DEBUG] * 3
    # No count of repeats yet: the minute has not ended.
    assert not [r for r in caplog.records if "more" in r.getMessage()]
    for record in caplog.records:
        message = record.getMessage()
        assert token_free(message, host.token)
        assert "not-the-token" not in message
        assert "Bearer" not in message
