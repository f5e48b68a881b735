"""Stuck on purpose: run only by tests/test_stuck_tests_fail.py, in a pytest of its own (the file
name keeps it out of the suite's collection)."""

from __future__ import annotations

import pytest
import trio
import trio.testing


@pytest.mark.deadline(1)
async def test_stuck_in_a_livelock(autojump_clock: trio.testing.MockClock) -> None:
    """A task always runnable holds the mock clock still, so the test's own deadline never
    comes: only the real-time one ends it."""

    async def spin() -> None:
        while True:
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spin)
        with trio.fail_after(10):
            await trio.sleep_forever()
