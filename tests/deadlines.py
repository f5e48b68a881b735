"""No test can hang: every test has a deadline in real time, and a stuck test fails with the
place it was stuck.

Two bounds, because a test can be stuck in two ways:

- A Trio test whose tasks wait forever, or keep each other runnable without end (a livelock:
  a mock clock's virtual time then never moves, so no ``trio.fail_after`` inside the test
  fires). After :data:`DEFAULT_DEADLINE_S` seconds of *real* time a watchdog thread cancels
  the test from inside its run and the test fails, its report listing where every task was
  waiting at that moment (each task's await frames).
- Anything else: a blocking call in the main thread, a fixture's teardown, a cancelled test
  that still does not end. :data:`GRACE_S` seconds past the deadline (for the whole test:
  set-up, call and tear-down), ``faulthandler`` writes every thread's stack on the terminal and ends
  the process with an error status: the run fails instead of hanging.

A test that needs longer says so: ``@pytest.mark.deadline(600)`` (seconds of real time; the
hard bound moves with it). The ``long`` Hypothesis profile (``nox -s
long``) runs thousands of examples per test, so there the hard bound is off and the deadline
holds per example.
"""

from __future__ import annotations

import faulthandler
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import pytest
import trio

#: Real seconds a Trio test may run; the slowest test of the default suite takes ~20 s on a
#: loaded two-core machine, so only a hang reaches this.
DEFAULT_DEADLINE_S: Final = 120.0
#: Real seconds a test has, past its deadline, to end (set-up and tear-down included) before
#: the process is ended with every thread's stack: time for a cancelled test to unwind.
GRACE_S: Final = 60.0

#: Frames of the machinery, left out of a stuck test's report (each task shows its own code).
LIBRARY_FRAMES: Final = ("/trio/", "/pytest_trio/", "/outcome/")

_report_fd: int | None = None


def deadline_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("deadline")
    return float(marker.args[0]) if marker is not None else DEFAULT_DEADLINE_S


def task_stacks() -> str:
    """Where every task of the current Trio run waits (call in the run's thread)."""
    lines: list[str] = []

    def visit(task: trio.lowlevel.Task, depth: int) -> None:
        lines.append(f"{'  ' * depth}task {task.name}")
        for frame, lineno in task.iter_await_frames():
            code = frame.f_code
            if any(part in code.co_filename for part in LIBRARY_FRAMES):
                continue
            lines.append(f"{'  ' * depth}  {code.co_filename}:{lineno} in {code.co_name}")
        for nursery in task.child_nurseries:
            for child in sorted(nursery.child_tasks, key=lambda t: t.name):
                visit(child, depth + 1)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        visit(root, 0)
    return "\n".join(lines)


def with_deadline(test: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """``test`` (an async test function) cancelled after ``seconds`` of real time, failing
    with every task's await frames as they were when the time ran out."""

    @functools.wraps(test)
    async def guarded(**kwargs: Any) -> Any:
        token = trio.lowlevel.current_trio_token()
        stuck: list[str] = []
        with trio.CancelScope() as scope:

            def expire() -> None:
                stuck.append(task_stacks())
                scope.cancel()

            timer = threading.Timer(seconds, token.run_sync_soon, (expire,))
            timer.daemon = True
            timer.start()
            try:
                return await test(**kwargs)
            except BaseException as exc:
                if stuck:
                    raise _failure(seconds, stuck[0]) from exc
                raise
            finally:
                timer.cancel()
        if stuck:
            raise _failure(seconds, stuck[0])
        return None

    guarded._deadline_guarded = True  # type: ignore[attr-defined]
    return guarded


def _failure(seconds: float, stacks: str) -> BaseException:
    message = f"the test did not end within {seconds:.0f} s of real time; its tasks were at:"
    try:
        pytest.fail(f"{message}\n{stacks}", pytrace=True)
    except pytest.fail.Exception as exc:
        return exc
    raise AssertionError("unreachable")


def guard(item: pytest.Item) -> None:
    """Give a Trio test its deadline (call before pytest-trio wraps the test function)."""
    if not isinstance(item, pytest.Function) or item.get_closest_marker("trio") is None:
        return
    seconds = deadline_of(item)
    hypothesis = getattr(item.obj, "hypothesis", None)
    holder, name = (hypothesis, "inner_test") if hypothesis is not None else (item, "obj")
    test = getattr(holder, name)
    if inspect.iscoroutinefunction(test) and not getattr(test, "_deadline_guarded", False):
        setattr(holder, name, with_deadline(test, seconds))


def configure(config: pytest.Config) -> None:
    global _report_fd
    config.addinivalue_line(
        "markers",
        "deadline(seconds): real seconds this test may take before it fails as stuck "
        f"(default {DEFAULT_DEADLINE_S:.0f})",
    )
    # The terminal's stderr (capturing is suspended while plugins configure): a process ended
    # by the hard bound must still show where it was stuck.
    _report_fd = os.dup(2)


@contextmanager
def hard_bound(item: pytest.Item) -> Iterator[None]:
    """End the process with every thread's stack if ``item`` outlives its hard bound."""
    report = _report_fd
    armed = os.environ.get("HYPOTHESIS_PROFILE") != "long" and report is not None
    if armed and report is not None:
        seconds = deadline_of(item) + GRACE_S
        faulthandler.dump_traceback_later(seconds, exit=True, file=report)
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()
