"""Steering a running turn: the messages a user adds while a prompt's run works, from their
durable admission to the backend that takes them.

A steering message is written to the task's history first (in order with what the run has
said so far), then waits in the run's :class:`SteeringInbox` until the backend takes it with
``Turn.steering()``. One the backend has not taken when its ``run_turn`` returns becomes the
message of a follow-up backend turn in the same run (see ``Run.drive``), so every admitted
message reaches the backend exactly once, unless the run is cancelled or fails first: then it
stays in the history only (replayed on load, and part of the next turn's ``history``).

Resource handling: none (plain state and one event). Error handling: a failed admission
leaves nothing in the inbox. Cancellation: ``wait`` is an ordinary checkpoint.
"""

from __future__ import annotations

import enum
from typing import Final

import trio

from maple_acp.model import TimelineItem

#: Steering messages one run may hold that its backend has not taken yet: a backend that
#: never reads them must not let a client pile up an unbounded follow-up turn.
MAX_WAITING_STEERS: Final = 32
#: Steering messages that become one follow-up turn's prompt are joined as prompt blocks are.
STEERING_SEPARATOR: Final = "\n\n"


class SteeringOutcome(enum.Enum):
    """What ``SessionLease.steer`` did with a message."""

    #: Admitted to the history and handed to the running prompt turn.
    INJECTED = "injected"
    #: No prompt turn runs (nothing admitted): the caller may start one with the message.
    IDLE = "idle"


class SteeringInbox:
    """One run's steering messages: admitted ones waiting for the backend, and admissions
    still being written (``reserve`` … ``admitted`` / ``abandoned``). Closed when the run is
    cancelled or its last backend turn returned with none left: from then on it takes none."""

    def __init__(self) -> None:
        self._serial = 0
        #: Item ids being written, in the order they were reserved.
        self._admitting: list[str] = []
        self._waiting: list[TimelineItem] = []
        self._closed = False
        self._changed = trio.Event()

    @property
    def open(self) -> bool:
        return not self._closed

    @property
    def full(self) -> bool:
        return len(self._admitting) + len(self._waiting) >= MAX_WAITING_STEERS

    def reserve(self, run_id: str) -> str:
        """The item id of a message about to be written (call with no checkpoint after the
        check that the run takes steering). The run does not end its steering while it is
        being written."""
        self._serial += 1
        item_id = f"{run_id}-steer{self._serial}"
        self._admitting.append(item_id)
        return item_id

    def admitted(self, item: TimelineItem) -> None:
        """``item`` is durably in the history: the backend may take it now."""
        self._admitting.remove(item.item_id)
        self._waiting.append(item)
        self._wake()

    def abandoned(self, item_id: str) -> None:
        """The write of ``item_id`` failed: nothing to deliver."""
        self._admitting.remove(item_id)
        self._wake()

    def take(self) -> tuple[TimelineItem, ...]:
        """Every admitted message not taken yet, oldest first; each is returned once."""
        taken = tuple(self._waiting)
        self._waiting.clear()
        return taken

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def pending_ids(self) -> frozenset[str]:
        """Ids of messages still to be delivered (waiting or being written)."""
        return frozenset(self._admitting) | {item.item_id for item in self._waiting}

    async def wait(self) -> None:
        """Return once a message is waiting (at once if one is)."""
        while not self._waiting:
            await self._changed.wait()

    async def settle(self) -> None:
        """Return once no message is being written, with no checkpoint after the last check:
        the caller then decides on what is waiting before another admission can start."""
        while self._admitting:
            await self._changed.wait()

    def close(self) -> None:
        """Take no more messages (what is being written still lands in the history)."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


class SlotWatch:
    """A pulse for whoever waits on a lease's prompt slot (a steering message waiting for a
    prompt's run to start or end): every change of the slot, the active run or the lease's
    life wakes every waiter, which then looks again."""

    def __init__(self) -> None:
        self._changed = trio.Event()

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self) -> None:
        await self._changed.wait()
