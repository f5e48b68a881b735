"""Admission order: which inbound requests must wait for which before they decide. Sans-I/O.

Requests read from one connection run concurrently, each in its own task, and Trio starts
tasks in no promised order (it shuffles them on purpose). What a request *decides* (a claim,
a choice, a refusal) must still follow the order the requests arrived in. So the reader gives
each request a ticket (its inbound frame index) and an ordering key as it reads it; a
request's handler waits until every earlier request it conflicts with has been *admitted*
(made its decision, or finished), decides, and says so. Its work then goes on concurrently.

Two keys conflict when they are equal, or when either is :data:`EVERYTHING` (a request that
decides for the whole connection, such as the protocol version). The key ``None`` conflicts
only with :data:`EVERYTHING`: such a request decides nothing another one depends on.

A notification may need the same order (a cancel must reach the request that arrived before
it, even one still waiting for its turn): :meth:`AdmissionOrder.defer` holds a callback until
every earlier conflicting request has been admitted.

:class:`AdmissionOrder` is the rule and does no waiting; :class:`AdmissionGate` is what the
peer holds: the order, the handlers waiting for their turn, and running what is freed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Final

import trio

logger = logging.getLogger(__name__)

#: The key of a request that every other request, before and after it, is ordered against.
EVERYTHING: Final = object()


def _conflict(a: Hashable | None, b: Hashable | None) -> bool:
    if a is EVERYTHING or b is EVERYTHING:
        return True
    return a is not None and a == b


class AdmissionOrder:
    """The tickets not yet admitted, in arrival order, and the callbacks waiting on them."""

    def __init__(self) -> None:
        #: ticket -> key, in arrival order (tickets only grow).
        self._waiting: dict[int, Hashable | None] = {}
        #: (ticket, key, callback) held back by an earlier conflicting ticket, in order.
        self._deferred: list[tuple[int, Hashable | None, Callable[[], None]]] = []

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def deferred(self) -> int:
        """Callbacks held back (the caller bounds how many it defers)."""
        return len(self._deferred)

    def enter(self, ticket: int, key: Hashable | None) -> None:
        """A request arrived (call in arrival order: tickets must grow)."""
        if self._waiting and ticket <= next(reversed(self._waiting)):
            raise ValueError("tickets must be entered in arrival order")
        self._waiting[ticket] = key

    def blocked(self, ticket: int, key: Hashable | None) -> bool:
        """Whether an earlier ticket that conflicts with ``key`` is not admitted yet."""
        for earlier, earlier_key in self._waiting.items():
            if earlier >= ticket:
                return False
            if _conflict(earlier_key, key):
                return True
        return False

    def ready(self, ticket: int) -> bool:
        """Whether the request with ``ticket`` may decide now (``True`` once admitted)."""
        if ticket not in self._waiting:
            return True
        return not self.blocked(ticket, self._waiting[ticket])

    def admit(self, ticket: int) -> list[Callable[[], None]]:
        """The request with ``ticket`` has decided (or finished). Returns the deferred
        callbacks now free to run, in arrival order (the caller runs them). Idempotent."""
        if self._waiting.pop(ticket, _ABSENT) is _ABSENT or not self._deferred:
            return []
        free: list[Callable[[], None]] = []
        still: list[tuple[int, Hashable | None, Callable[[], None]]] = []
        for entry in self._deferred:
            earlier_held = any(_conflict(entry[1], key) for _, key, _ in still)
            if earlier_held or self.blocked(entry[0], entry[1]):
                still.append(entry)
            else:
                free.append(entry[2])
        self._deferred = still
        return free

    def defer(self, ticket: int, key: Hashable | None, callback: Callable[[], None]) -> bool:
        """Hold ``callback`` (a notification that arrived as ``ticket``) until every earlier
        conflicting request has been admitted. ``False`` if none holds it back: the caller
        runs it now."""
        held = any(_conflict(key, other) for _, other, _ in self._deferred)
        if not held and not self.blocked(ticket, key):
            return False
        self._deferred.append((ticket, key, callback))
        return True


_ABSENT: Final = object()


class AdmissionGate:
    """One connection's admission: its :class:`AdmissionOrder`, the request handlers waiting
    for their turn (by ticket), and the held callbacks run once they are free."""

    __slots__ = ("_order", "_waiters")

    def __init__(self) -> None:
        self._order = AdmissionOrder()
        #: Handlers waiting for their turn to decide, by ticket (their arrival).
        self._waiters: dict[int, trio.Event] = {}

    @property
    def deferred(self) -> int:
        """Callbacks held back for now."""
        return self._order.deferred

    def enter(self, ticket: int, key: Hashable | None) -> None:
        """A request arrived (in arrival order)."""
        self._order.enter(ticket, key)

    def ready(self, ticket: int) -> bool:
        """Whether the request with ``ticket`` may decide now."""
        return self._order.ready(ticket)

    async def turn(self, ticket: int) -> None:
        """Wait until the request with ``ticket`` may decide."""
        event = self._waiters[ticket] = trio.Event()
        try:
            await event.wait()
        finally:
            self._waiters.pop(ticket, None)

    def admit(self, ticket: int) -> None:
        """The request with ``ticket`` has decided (or finished): wake the handlers now free
        to decide and run the callbacks now free. Idempotent."""
        free = self._order.admit(ticket)
        for waiting, event in list(self._waiters.items()):
            if self._order.ready(waiting):
                del self._waiters[waiting]
                event.set()
        for callback in free:
            _run(callback)

    def in_order(self, ticket: int, key: Hashable | None, callback: Callable[[], None]) -> None:
        """Run ``callback`` (of a notification that arrived as ``ticket``) now, or once every
        earlier request conflicting with ``key`` has been admitted."""
        if not self._order.defer(ticket, key, callback):
            _run(callback)


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        logger.exception("an action held for admission order failed")
