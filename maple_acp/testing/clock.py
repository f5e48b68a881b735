"""Virtual time for tests that also touch the SQLite store, and waiting until all is quiet.

``trio.testing.MockClock(autojump_threshold=0)`` jumps to the next deadline as soon as every
task is blocked — and a task waiting for a worker thread counts as blocked. A store call in
flight (SQLite runs in a worker thread) would therefore let a five-second deadline expire
while the write takes a millisecond of real time.

:class:`VirtualTimeStore` wraps a real store: while one of its calls runs in the thread, a
helper task keeps the scheduler busy, so the clock cannot jump past it. Everything else — the
SQLite file, its transactions, its thread — is the real thing::

    async with temp_store(tmp_path) as store:
        runtime = make_demo_service(VirtualTimeStore(store))

The runtime's own worker-thread calls (a directory canonicalised, a project scanned for skills)
hold such a clock still by themselves (``maple_acp.runtime.in_worker_thread``). Under a frozen
clock (``MockClock()``, whose autojump is off) nothing moves virtual time but the test: every
deadline of the library - the one second a connection's requests get to be answered after
the client finished sending, the five seconds of a close or a disconnect's cleanup, the
provisional grace period and its sweep - is virtual time, so a step that waits for one blocks
until the test calls ``clock.jump``.

:func:`wait_quiet` waits until the service has nothing left to do that time does not decide:
every task blocked, no worker thread working, no child process alive.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from typing import Any

import trio
import trio.testing

from maple_acp.runtime import hold_virtual_time

__all__ = ["ClockHoldingStore", "VirtualTimeStore", "hold_virtual_time", "wait_quiet"]

#: How long (real time) a wait for quiet sleeps between looks while a worker thread works.
QUIET_POLL_S = 0.0005


def _waits_for_a_thread(task: trio.lowlevel.Task) -> bool:
    coro: Any = task.coro
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None and frame.f_code is _TO_THREAD_CODE:
            return True
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return any(
        _waits_for_a_thread(child)
        for nursery in task.child_nurseries
        for child in nursery.child_tasks
    )


#: Worker threads (the store's own limiter included) all go through this function; a task
#: suspended in it is waiting for real work that virtual time knows nothing of.
_TO_THREAD_CODE = trio.to_thread.run_sync.__code__


#: The children this process already had when a run began serving (another test's server, a
#: browser still closing): not the service's, so never waited for. Noted by
#: :func:`ignore_present_children`; a run that noted none waits for every live child.
_FOREIGN_CHILDREN: trio.lowlevel.RunVar[frozenset[str]] = trio.lowlevel.RunVar(
    "maple_acp_foreign_children", frozenset()
)


def ignore_present_children() -> None:
    """Note the children this process has now as none of this run's: :func:`wait_quiet`
    never waits for them (the kit's harness and driver call it before anything starts)."""
    _FOREIGN_CHILDREN.set(frozenset(_live_children()))


def _live_children() -> set[str]:
    """The pids of this process's children (Linux's ``/proc``; elsewhere: none known). An
    ended child not yet reaped counts: its parent still has to notice it ended."""
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return set()
    found: set[str] = set()
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/children") as handle:
                found.update(handle.read().split())
        except OSError:
            continue
    return found


def _children_alive() -> bool:
    """Whether a child of this run (one not noted as foreign) is alive."""
    return bool(_live_children() - _FOREIGN_CHILDREN.get())


async def wait_quiet() -> None:
    """Return once every task is blocked, no worker thread is working for one and no child
    process is alive: what the service does next depends only on the test (a request, a
    disconnect, virtual time moving). ``trio.testing.wait_all_tasks_blocked`` alone returns
    while a thread works, since a task waiting for a thread counts as blocked.

    Real time passes while it waits for a thread or a child; virtual time does not (a
    clock with autojump stands still while a wait for quiet is the earliest waiter)."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    while True:
        await trio.testing.wait_all_tasks_blocked()
        if not (_waits_for_a_thread(root) or _children_alive()):
            return
        await trio.testing.wait_all_tasks_blocked(QUIET_POLL_S)


class VirtualTimeStore:
    """A task store proxy whose calls hold virtual time still (see the module docstring)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if inspect.iscoroutinefunction(attr):
            return hold_virtual_time(attr)
        return attr


class ClockHoldingStore:
    """A task store proxy that holds a mock clock still during its calls without a busy task:
    the clock's autojump is switched off (threshold set to infinity) while any call runs in the
    store's thread, and put back when the last one returns.

    Unlike :class:`VirtualTimeStore`, a store call in flight counts as blocked for
    ``trio.testing.wait_all_tasks_blocked``: a test that waits for everything to settle waits
    for :meth:`settled` instead. What it saves is the busy tasks' cost: each queued call's busy
    task is stepped at every scheduler pass, so every call waits for a pass over all the others
    and the store's thread fights them for the interpreter lock: the time grows faster than
    the calls queued (a test of 64 prompting sessions took 3.2 s, of 128 10.3 s; with this
    proxy 2.5 s and 5.8 s), virtual time standing still all along. For tests that queue many
    calls."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._calls = 0
        self._threshold = 0.0
        self._idle = trio.Event()
        self._idle.set()

    async def settled(self) -> None:
        """Return once every task is blocked and no store call is in flight: what
        ``wait_all_tasks_blocked`` means under :class:`VirtualTimeStore` (:func:`wait_quiet`
        covers every worker thread, not only the store's)."""
        while True:
            await self._idle.wait()
            await trio.testing.wait_all_tasks_blocked()
            if self._calls == 0:
                return

    def _hold(self) -> trio.testing.MockClock | None:
        clock = trio.lowlevel.current_clock()
        if not isinstance(clock, trio.testing.MockClock):
            return None
        if self._calls == 0:
            self._threshold = clock.autojump_threshold
            clock.autojump_threshold = math.inf
            self._idle = trio.Event()
        self._calls += 1
        return clock

    def _release(self, clock: trio.testing.MockClock) -> None:
        self._calls -= 1
        if self._calls == 0:
            clock.autojump_threshold = self._threshold
            self._idle.set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            clock = self._hold()
            try:
                return await attr(*args, **kwargs)
            finally:
                if clock is not None:
                    self._release(clock)

        return call
