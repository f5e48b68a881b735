"""The runtime's one way into a worker thread, and virtual time held still while it works.

``trio.testing.MockClock(autojump_threshold=0)`` jumps to the next deadline as soon as every
task is blocked, and a task waiting for a worker thread counts as blocked: a directory
canonicalised or a project scanned for skills (a millisecond of real work) would let a
five-second deadline, or the minute of the provisional sweep, pass meanwhile. Every thread
call of the runtime goes through :func:`in_worker_thread`; under a clock that may jump, a task
stays runnable while the thread works, so the clock cannot jump past it. On any other clock
it is ``trio.to_thread.run_sync`` and nothing more.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import trio
import trio.testing

_P = ParamSpec("_P")
_T = TypeVar("_T")


def clock_may_jump() -> bool:
    """Whether the current clock jumps on its own when every task is blocked."""
    clock = trio.lowlevel.current_clock()
    return isinstance(clock, trio.testing.MockClock) and clock.autojump_threshold != math.inf


async def _keep_busy(done: trio.Event) -> None:
    # Runnable at every scheduler pass until ``done``: the autojump clock only jumps when no
    # task is runnable.
    while not done.is_set():
        await trio.lowlevel.cancel_shielded_checkpoint()


def hold_virtual_time(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """Wrap an async callable so a clock that may jump stands still while it runs."""

    @functools.wraps(fn)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        if not clock_may_jump():
            # No clock that could jump: a busy task would hold nothing still, and with many
            # calls queued the busy tasks starve the thread of the interpreter lock.
            return await fn(*args, **kwargs)
        done = trio.Event()
        error: BaseException | None = None
        result: _T
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep_busy, done)
            try:
                result = await fn(*args, **kwargs)
            except Exception as exc:
                # Raised after the nursery, so the caller sees the call's own exception and
                # not an exception group around it.
                error = exc
            finally:
                done.set()
        if error is not None:
            raise error
        return result

    return call


async def in_worker_thread(fn: Callable[..., _T], *args: object) -> _T:
    """``fn(*args)`` in a worker thread, virtual time held still meanwhile (see the module
    docstring). Cancellation waits for the thread, as ``trio.to_thread.run_sync`` does."""
    return await hold_virtual_time(trio.to_thread.run_sync)(fn, *args)
