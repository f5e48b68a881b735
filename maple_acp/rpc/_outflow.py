"""Outbound flow control of one connection: the shared credit, the senders waiting for it in
arrival order, and the reply reserve the reading task draws on.

:class:`~maple_acp.rpc._credit.OutboundCredit` says what fits; this adds who waits for it.
A sender whose line does not fit waits in a strict FIFO (a large line at the head is not
starved by small ones behind it) and is woken when the writer gives credit back. The reading
task never waits: a reply it owes takes the shared credit if it is free now and nobody waits,
else the small reserve of its own. No I/O here; the peer's writer releases what it wrote.
"""

from __future__ import annotations

from collections import deque

import trio

from ._credit import REPLY_RESERVE_BYTES, REPLY_RESERVE_LINES, OutboundCredit
from ._exceptions import OutboundFrameTooLarge


def _try_take(credit: OutboundCredit, charge: int) -> bool:
    """Take ``charge`` from ``credit`` if it fits now; a charge it could never hold is no."""
    try:
        return credit.try_acquire(charge)
    except OutboundFrameTooLarge:
        return False


class CreditWaiter:
    """One sender waiting for ``charge``: ``event`` is set once it is granted, or once the
    connection ended (then ``granted`` stays false)."""

    __slots__ = ("charge", "event", "granted")

    def __init__(self, charge: int) -> None:
        self.charge = charge
        self.event = trio.Event()
        self.granted = False


class OutboundFlow:
    """The shared ``credit``, its ``waiters`` (FIFO) and the reader's reply ``reserve``.

    The peer's streaming path reads ``credit`` and ``waiters`` directly (take at once when
    nobody waits); everything slower goes through the methods."""

    __slots__ = ("credit", "reserve", "waiters")

    def __init__(self, *, max_lines: int, max_bytes: int) -> None:
        self.credit = OutboundCredit(max_lines=max_lines, max_bytes=max_bytes)
        self.reserve = OutboundCredit(max_lines=REPLY_RESERVE_LINES, max_bytes=REPLY_RESERVE_BYTES)
        self.waiters: deque[CreditWaiter] = deque()

    async def wait(self, charge: int) -> bool:
        """Wait in line for ``charge``; True once it is taken, False if the connection ended
        first (:meth:`close`). :class:`OutboundFrameTooLarge` for a charge the budget could
        never hold. A cancelled waiter gives back a grant it got, or leaves the line."""
        self.credit.check_admissible(charge)
        waiter = CreditWaiter(charge)
        self.waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self.release(charge)
            elif not waiter.event.is_set():
                # (When the event is set without a grant, the connection ended and emptied the
                # queue while this sender was being cancelled: nothing to remove or hand on.)
                self.waiters.remove(waiter)
                self.grant()
            raise
        return waiter.granted

    def release(self, charge: int) -> None:
        """Give back one line's ``charge`` and grant what now fits."""
        self.credit.release(charge)
        if self.waiters:
            self.grant()

    def written(self, shared: tuple[int, int], reserved: tuple[int, int]) -> None:
        """The writer wrote lines whose credit was ``shared`` (bytes, lines) of the shared
        credit and ``reserved`` of the reply reserve: give it back, grant what now fits."""
        if shared[1]:
            self.credit.release(*shared)
        if reserved[1]:
            self.reserve.release(*reserved)
        if self.waiters:
            self.grant()

    def grant(self) -> None:
        """Grant waiters in order while the head one fits."""
        waiters = self.waiters
        while waiters and self.credit.try_acquire(waiters[0].charge):
            waiter = waiters.popleft()
            waiter.granted = True
            waiter.event.set()

    def take_reply(self, charge: int) -> int | None:
        """Credit for a reply the reader owes, without waiting: ``charge`` from the shared
        credit, ``-charge`` from the reserve, ``None`` when neither has room."""
        if not self.waiters and _try_take(self.credit, charge):
            return charge
        if _try_take(self.reserve, charge):
            return -charge
        return None

    def close(self) -> None:
        """The connection ended: wake every waiter without a grant."""
        waiters = self.waiters
        while waiters:
            waiters.popleft().event.set()
