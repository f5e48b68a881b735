"""The table of outgoing requests waiting for their answers, and the wait of one. Sans-I/O."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import trio

from ._envelope import RequestId

W = TypeVar("W")


class OutgoingCall:
    """One outgoing request waiting for its answer."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result = result
        self.error = error
        self.done.set()


class PendingRequests(Generic[W]):
    """Allocates ids for outgoing requests and maps each id to whatever waits for its answer.

    Ids are consecutive integers starting at 1 and never reused within one connection, so an
    answer that arrives after its request was abandoned cannot reach a newer request.
    """

    __slots__ = ("_next_id", "_waiting")

    def __init__(self) -> None:
        self._next_id = 1
        self._waiting: dict[int, W] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, msg_id: object) -> bool:
        return type(msg_id) is int and msg_id in self._waiting

    def allocate_id(self) -> int:
        msg_id = self._next_id
        self._next_id += 1
        return msg_id

    def add(self, msg_id: int, waiter: W) -> None:
        if msg_id in self._waiting:
            raise RuntimeError(f"request id {msg_id} is already pending")
        self._waiting[msg_id] = waiter

    def pop(self, msg_id: RequestId) -> W | None:
        """Remove and return the waiter for an answer's id; ``None`` if nothing waits on it.

        Only integer ids are ours: a string ``"1"`` never matches request 1.
        """
        if type(msg_id) is not int:
            return None
        return self._waiting.pop(msg_id, None)

    def pop_all(self) -> list[W]:
        """Remove and return every waiter (the connection ended)."""
        waiters = list(self._waiting.values())
        self._waiting.clear()
        return waiters
