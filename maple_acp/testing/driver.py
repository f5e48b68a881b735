"""Driving a Trio service from Hypothesis's synchronous rules.

A ``RuleBasedStateMachine``'s rules are plain functions, and a service lives in a Trio loop
that must outlast each of them. :class:`TrioDriver` runs one Trio loop in a thread of its own
for the life of a machine (one example): a rule hands it a coroutine function with
:meth:`TrioDriver.run`, which returns what it returned once the service is quiet again::

    class HostMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.driver = TrioDriver()
            self.harness = self.driver.enter(running_acp(self.directory, backend=...))

        @rule()
        def connect(self) -> None:
            self.conns.append(self.driver.run(self.harness.open_connection, initialize=True))

        def teardown(self) -> None:
            self.driver.close()

Time is a ``trio.testing.MockClock`` that stands still between steps; during a step it jumps
to the next deadline only when every task waits for one (autojump), so a step that waits for
the one-second end-of-input grace of a disconnect, or a close's five-second deadline, ends
without real waiting and no step leaves time moved behind the test's back. ``advance``
moves it on purpose (a grace period, a sweep). After each step the driver waits until all is
quiet (:func:`~maple_acp.testing.clock.wait_quiet`), so the next rule sees what this one
caused.

Resource handling: :meth:`TrioDriver.close` leaves every context entered with
:meth:`TrioDriver.enter` (last first), cancels what is left and joins the thread. Error
handling: a step's exception is raised by the call that ran it; an exception that ends the
loop (a background task, a context's exit) by the next call or by :meth:`TrioDriver.close`;
a step still running after :data:`STEP_TIMEOUT_S` real seconds raises ``TimeoutError``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, suppress
from typing import Any, Final, TypeVar

import outcome
import trio
import trio.testing

from maple_acp.testing.clock import ignore_present_children, wait_quiet

__all__ = ["STEP_TIMEOUT_S", "TrioDriver"]

_T = TypeVar("_T")

#: Real seconds one step may take before the driver gives up on it: a step that waits for
#: something that never comes fails the example instead of hanging the run.
STEP_TIMEOUT_S: Final = 60.0


class TrioDriver:
    """One Trio loop in a thread, driven step by step (see the module docstring)."""

    def __init__(self, *, clock: trio.testing.MockClock | None = None) -> None:
        #: Frozen between steps (autojump off); a step switches autojump on while it runs.
        self.clock = clock or trio.testing.MockClock()
        self.clock.autojump_threshold = math.inf
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._exits: list[Callable[[], Awaitable[Any]]] = []
        self._error: BaseException | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            try:
                ignore_present_children()
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    ready.set()
                    await self._stop.wait()
                    while self._exits:
                        await self._exits.pop()()
                    nursery.cancel_scope.cancel()
            finally:
                ready.set()

        try:
            trio.run(main, clock=self.clock)
        except BaseException as exc:
            self._error = exc

    def _call(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``fn()`` as a task of the loop and wait for it, at most
        :data:`STEP_TIMEOUT_S` real seconds."""
        if self._error is not None:
            raise self._error
        done = threading.Event()
        box: list[outcome.Outcome[_T]] = []

        async def runner() -> None:
            try:
                box.append(outcome.Value(await fn()))
            except BaseException as exc:  # handed to the test's thread, raised there
                box.append(outcome.Error(exc))
            finally:
                done.set()

        def spawn() -> None:
            assert self._nursery is not None
            self._nursery.start_soon(runner)

        assert self._token is not None
        try:
            self._token.run_sync_soon(spawn)
        except trio.RunFinishedError:
            if self._error is not None:
                raise self._error from None
            raise
        if not done.wait(STEP_TIMEOUT_S):
            raise TimeoutError(
                f"a step took more than {STEP_TIMEOUT_S:.0f} s of real time: it waits for "
                "something no task will do"
            )
        return box[0].unwrap()

    def run(self, fn: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn(*args, **kwargs)`` in the loop as one step; return its result once every
        task is quiet again. Virtual time moves during the step only to a deadline every task
        waits for."""

        async def step() -> _T:
            self.clock.autojump_threshold = 0
            try:
                result = await fn(*args, **kwargs)
                await wait_quiet()
            finally:
                self.clock.autojump_threshold = math.inf
            return result

        return self._call(step)

    def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Call the plain function ``fn(*args)`` in the loop's thread as one step (what
        touches the loop's objects: ``HeldPermissions.answer_next``, a ``trio.Event``)."""

        async def sync() -> _T:
            return fn(*args)

        return self.run(sync)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)`` in the loop's nursery and return once it is quiet: work that
        goes on past the step (a prompt's turn). Its exception ends the loop."""

        async def start() -> None:
            assert self._nursery is not None
            self._nursery.start_soon(fn, *args)
            await wait_quiet()

        self._call(start)

    def enter(self, context: AbstractAsyncContextManager[_T]) -> _T:
        """Enter an async context manager in the loop (a running harness) and return its
        value; it is left at :meth:`close`, last entered first."""
        entered = trio.Event()
        leave = trio.Event()
        value: list[_T] = []

        async def hold() -> None:
            async with context as inside:
                value.append(inside)
                entered.set()
                await leave.wait()

        async def start() -> None:
            assert self._nursery is not None
            self._nursery.start_soon(hold)
            await entered.wait()
            await wait_quiet()

        async def exit_() -> None:
            leave.set()
            await wait_quiet()

        self._call(start)
        self._exits.append(exit_)
        return value[0]

    def advance(self, seconds: float) -> None:
        """Move virtual time ``seconds`` on (every deadline on the way fires), then wait until
        all is quiet."""

        async def jump() -> None:
            await wait_quiet()
            self.clock.jump(seconds)
            await wait_quiet()

        self._call(jump)

    def close(self) -> None:
        """Leave every entered context (last first), stop the loop and join its thread; raise
        what the loop raised, if anything."""
        if self._thread.is_alive() and self._stop is not None:
            stop = self._stop

            async def finish() -> None:
                self.clock.autojump_threshold = 0
                stop.set()

            with suppress(trio.RunFinishedError):
                trio.from_thread.run(finish, trio_token=self._token)
            self._thread.join(STEP_TIMEOUT_S)
        if self._error is not None:
            raise self._error
