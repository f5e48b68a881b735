"""The operation barrier of one lease: a count of operations in flight and whether a run is
active, with an event that is set exactly when both are zero; and its one prompt slot (who holds
it, the lock every write to the task's row takes, and the pulse its waiters wait on)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio

from maple_acp.runtime._steering import SlotWatch


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


class PromptSlot:
    """The task's one prompt slot, shared by the lease's parts: the claim that holds it (at
    most one), the lock every admission to the task's row takes (a prompt's message, a model,
    a mode, a thinking level), and the pulse that wakes whoever waits for the slot or the
    active run to change. ``on_free`` is told in the same step the slot frees or the active
    run changes (the prompt queue hands the slot on from there). Plain state: the rules about
    it are the turns', the queue's and the settings'."""

    def __init__(self) -> None:
        self.claim: PromptClaim | None = None
        self.admission = trio.Lock()
        self._watch = SlotWatch()
        self.on_free: Callable[[], None] = _nobody_waits

    @property
    def held(self) -> bool:
        return self.claim is not None

    @contextmanager
    def hold(self) -> Iterator[PromptClaim]:
        claim = self.take()
        try:
            yield claim
        finally:
            self.release(claim)

    def take(self) -> PromptClaim:
        """Hold the free slot (the caller checked it is free)."""
        if self.claim is not None:
            raise RuntimeError("the prompt slot is already held")
        claim = self.claim = PromptClaim()
        return claim

    def release(self, claim: PromptClaim) -> None:
        """End ``claim``'s hold (nothing if it no longer holds the slot)."""
        if self.claim is claim:
            self.claim = None
            self.changed()

    def changed(self) -> None:
        self._watch.changed()
        if self.claim is None:
            self.on_free()

    async def wait(self) -> None:
        """Until the slot, the active run or the lease's life changes next."""
        await self._watch.wait()


def _nobody_waits() -> None:
    """``PromptSlot.on_free`` of a slot with no queue behind it."""
