"""The operation barrier of one lease: a count of operations in flight and whether a run is
active, with an event that is set exactly when both are zero; and the token of its one prompt
slot."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio


class OperationBarrier:
    """``operation()`` marks work in flight; ``run_started``/``run_ended`` mark the active
    run; ``wait_idle`` returns once nothing is in flight and no run is active. Plain state, so
    close and release can rely on it without a socket or a backend."""

    def __init__(self) -> None:
        self._ops = 0
        self._run_active = False
        self._idle = trio.Event()
        self._idle.set()

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    @contextmanager
    def operation(self) -> Iterator[None]:
        self._ops += 1
        self._busy()
        try:
            yield
        finally:
            self._ops -= 1
            self._maybe_idle()

    def run_started(self) -> None:
        self._run_active = True
        self._busy()

    def run_ended(self) -> None:
        self._run_active = False
        self._maybe_idle()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def _busy(self) -> None:
        if self._idle.is_set():
            self._idle = trio.Event()

    def _maybe_idle(self) -> None:
        if self._ops == 0 and not self._run_active:
            self._idle.set()


class PromptClaim:
    """Proof that the holder owns the task's one prompt slot (see
    ``SessionLease.claim_prompt``). Opaque."""

    __slots__ = ()
