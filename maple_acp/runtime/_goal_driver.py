"""``GoalCycleDriver``: a task's goal state and the autonomous cycles it drives while the task
is quiescent."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from maple_acp.model import GoalRecord, GoalStatus, TimelineItem
from maple_acp.runtime import _goals
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._events import RunKind
from maple_acp.runtime._run import Run
from maple_acp.runtime._session_events import CycleStarted, GoalChanged, SessionEvents
from maple_acp.store import TaskStore

logger = logging.getLogger(__name__)

#: Refusals that mean the lease (or its account) ended under the driver: a quiet stop.
_LEASE_ENDED = frozenset(
    {RejectionKind.LEASE_REVOKED, RejectionKind.ACCOUNT_CHANGED, RejectionKind.SHUTTING_DOWN}
)


class GoalCycleDriver:
    """Holds one task's goal for its lease, persists every change, publishes it, and runs one
    autonomous cycle at a time while the goal is active and ``quiescent()`` says the task is
    free (no run, no prompt waiting, lease live and admitted).

    A prompt takes precedence: the lease cancels a running cycle before it admits a prompt; a
    cancelled cycle does not count as an iteration.
    """

    def __init__(
        self,
        *,
        task_id: str,
        goal: GoalRecord | None,
        store: TaskStore,
        now_ms: Callable[[], int],
        events: SessionEvents,
        read_history: Callable[[], Awaitable[tuple[TimelineItem, ...]]],
        launch_cycle: Callable[[str, tuple[TimelineItem, ...]], Awaitable[Run]],
        active_run: Callable[[], Run | None],
        quiescent: Callable[[], bool],
    ) -> None:
        self._task_id = task_id
        self._goal = goal
        self._store = store
        self._now_ms = now_ms
        self._events = events
        self._read_history = read_history
        self._launch_cycle = launch_cycle
        self._active_run = active_run
        self._quiescent = quiescent
        # Bumped by every set and clear, so a cycle of a replaced goal never updates the new one.
        self._epoch = 0
        self._wake = trio.Event()

    @property
    def goal(self) -> GoalRecord | None:
        return self._goal

    async def set(self, objective: str, token_budget: int | None) -> GoalRecord:
        goal = _goals.new_goal(objective, now_ms=self._now_ms(), token_budget=token_budget)
        self._epoch += 1
        self.cancel_cycle()
        await self._put(goal)
        return goal

    async def pause(self) -> GoalRecord:
        goal = _goals.paused(self._goal, now_ms=self._now_ms())
        self.cancel_cycle()
        await self._put(goal)
        return goal

    async def resume(self) -> GoalRecord:
        goal = _goals.resumed(self._goal, now_ms=self._now_ms())
        await self._put(goal)
        return goal

    async def clear(self) -> None:
        self._epoch += 1
        self.cancel_cycle()
        await self._put(None)

    def cancel_cycle(self) -> None:
        run = self._active_run()
        if run is not None and run.kind is RunKind.GOAL_CYCLE:
            run.cancel()

    def poke(self) -> None:
        """Something changed that may make a cycle due."""
        self._wake.set()

    async def _put(self, goal: GoalRecord | None) -> None:
        # The in-memory goal changes first: a cycle ending while the write is in flight must
        # already see a pause or a clear, or it would start the next cycle.
        previous = self._goal
        self._goal = goal
        self.poke()
        await self._store.put_goal(self._task_id, goal)
        self._events.publish(GoalChanged(self._task_id, goal))
        _log_transition(self._task_id, previous, goal)

    def _cycle_due(self) -> bool:
        goal = self._goal
        return goal is not None and goal.status is GoalStatus.ACTIVE and self._quiescent()

    async def drive(self) -> None:
        """Run autonomous goal cycles until cancelled (the lease's nursery ends)."""
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                if not self._cycle_due():
                    continue
                await self._events.wait_room()
                history = await self._read_history()
                # Checked again after every wait: a prompt, a pause or a clear may have come.
                if not self._cycle_due():
                    continue
                goal = self._goal
                assert goal is not None
                epoch = self._epoch
                run = await self._launch_cycle(goal.objective, history)
                self._events.publish(CycleStarted(run))
                outcome = await run.wait()
                current = self._goal
                if current is None or epoch != self._epoch:
                    continue
                updated = _goals.after_cycle(
                    current, outcome, run.goal_progress, now_ms=self._now_ms()
                )
                if updated is not None:
                    with trio.CancelScope(shield=True):
                        await self._put(updated)
                self.poke()
        except RuntimeRejection as rejection:
            if rejection.kind not in _LEASE_ENDED:
                logger.exception("goal cycles of task %s stopped", self._task_id)
            else:
                # The lease ended between a wake-up and the next read: its holder went away or
                # the account changed. That is the end of the cycles, not a defect.
                logger.debug("goal cycles of task %s ended: %s", self._task_id, rejection.kind)
        except Exception:
            logger.exception("goal cycles of task %s stopped", self._task_id)


def _log_transition(task_id: str, previous: GoalRecord | None, goal: GoalRecord | None) -> None:
    before = previous.status.value if previous is not None else "none"
    after = goal.status.value if goal is not None else "none"
    iterations = goal.iterations if goal is not None else 0
    # The objective is the user's text: it stays out of the log.
    logger.info("goal of task %s: %s -> %s (iterations %d)", task_id, before, after, iterations)
