"""Outbound credit accounting and the outgoing-request table, without any I/O."""

from __future__ import annotations

import pytest

from maple_acp.rpc import (
    FRAME_OVERHEAD_BYTES,
    MAX_OUTBOUND_BYTES,
    MAX_OUTBOUND_LINES,
    OutboundCredit,
    OutboundFrameTooLarge,
    PendingRequests,
)


def test_defaults_and_the_charge_formula() -> None:
    credit = OutboundCredit()
    assert (credit.max_lines, credit.max_bytes) == (256, 4 * 1024 * 1024)
    assert (MAX_OUTBOUND_LINES, MAX_OUTBOUND_BYTES, FRAME_OVERHEAD_BYTES) == (256, 4 << 20, 256)
    assert OutboundCredit.charge_for(100) == 356
    assert OutboundCredit.charge_for(0) == 256


def test_line_limit() -> None:
    credit = OutboundCredit(max_lines=3)
    assert all(credit.try_acquire(300) for _ in range(3))
    assert not credit.try_acquire(300)
    assert (credit.lines_in_use, credit.bytes_in_use) == (3, 900)
    credit.release(300)
    assert credit.try_acquire(300)


def test_byte_limit_counts_the_overhead() -> None:
    credit = OutboundCredit(max_bytes=1000)
    assert credit.try_acquire(OutboundCredit.charge_for(400))  # 656
    assert not credit.try_acquire(OutboundCredit.charge_for(100))  # 656 + 356 > 1000
    assert credit.try_acquire(OutboundCredit.charge_for(88))  # exactly 1000
    assert credit.bytes_in_use == 1000
    assert not credit.try_acquire(OutboundCredit.charge_for(0))


def test_an_oversize_frame_is_refused_distinctly_and_takes_nothing() -> None:
    credit = OutboundCredit(max_bytes=1000)
    assert credit.try_acquire(1000)
    credit.release(1000)
    with pytest.raises(OutboundFrameTooLarge, match="1001"):
        credit.try_acquire(1001)
    assert (credit.lines_in_use, credit.bytes_in_use) == (0, 0)
    # Refused even while empty: it could never be admitted, so it must not be waited for.
    with pytest.raises(OutboundFrameTooLarge):
        credit.check_admissible(OutboundCredit.charge_for(1000))


def test_releasing_more_than_was_taken_is_a_bug() -> None:
    credit = OutboundCredit()
    with pytest.raises(RuntimeError):
        credit.release(256)
    credit.try_acquire(300)
    with pytest.raises(RuntimeError):
        credit.release(301)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_lines": 0},
        {"max_bytes": 0},
        {"max_lines": MAX_OUTBOUND_LINES + 1},
        {"max_bytes": MAX_OUTBOUND_BYTES + 1},
    ],
)
def test_limits_are_positive_and_only_lowered(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="outbound limits"):
        OutboundCredit(**kwargs)


def test_pending_ids_are_fresh_and_only_exact_integer_ids_match() -> None:
    table: PendingRequests[str] = PendingRequests()
    first, second = table.allocate_id(), table.allocate_id()
    assert first != second
    table.add(first, "a")
    table.add(second, "b")
    assert first in table
    assert str(first) not in table
    assert table.pop(str(first)) is None
    assert table.pop(float(first)) is None  # type: ignore[arg-type]
    assert table.pop(first) == "a"
    assert table.pop(first) is None  # a late duplicate answer finds nothing
    with pytest.raises(RuntimeError):
        table.add(second, "again")
    assert table.pop_all() == ["b"]
    assert len(table) == 0
    assert table.allocate_id() not in (first, second)


def test_a_batch_takes_all_its_credit_or_none() -> None:
    credit = OutboundCredit(max_lines=4, max_bytes=10_000)
    assert credit.try_acquire_many(3, 3_000)
    assert not credit.try_acquire_many(2, 100)  # one line too many
    assert not credit.try_acquire_many(1, 7_001)  # bytes too many
    assert (credit.lines_in_use, credit.bytes_in_use) == (3, 3_000)
    assert credit.try_acquire_many(1, 7_000)
    credit.release(10_000, 4)
    assert (credit.lines_in_use, credit.bytes_in_use) == (0, 0)
