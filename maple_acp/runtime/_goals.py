"""Goal state transitions: pure functions over ``GoalRecord``, so the rules are testable
without a run."""

from __future__ import annotations

import attrs

from maple_acp.model import GoalRecord, GoalStatus
from maple_acp.runtime._backend import GoalProgress
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection, bounded_text
from maple_acp.runtime._events import RunOutcome, RunState

#: An objective is one instruction, not a document.
MAX_GOAL_OBJECTIVE_CHARS = 4_000
#: Autonomous cycles of one goal before it is marked limited; a goal that never concludes
#: must not drive the backend forever.
MAX_GOAL_ITERATIONS = 100

_RESUMABLE = (GoalStatus.PAUSED, GoalStatus.BLOCKED, GoalStatus.LIMITED)


def new_goal(objective: str, *, now_ms: int, token_budget: int | None = None) -> GoalRecord:
    text = objective.strip() if isinstance(objective, str) else ""
    if not text:
        raise RuntimeRejection(RejectionKind.INVALID_GOAL, "a goal objective must not be blank")
    if len(text) > MAX_GOAL_OBJECTIVE_CHARS:
        raise RuntimeRejection(
            RejectionKind.INVALID_GOAL,
            f"a goal objective is limited to {MAX_GOAL_OBJECTIVE_CHARS} characters",
        )
    if token_budget is not None and token_budget <= 0:
        raise RuntimeRejection(RejectionKind.INVALID_GOAL, "a token budget must be positive")
    return GoalRecord(
        objective=text,
        status=GoalStatus.ACTIVE,
        created_ms=now_ms,
        updated_ms=now_ms,
        token_budget=token_budget,
        tokens_used=0 if token_budget is not None else None,
    )


def paused(goal: GoalRecord | None, *, now_ms: int) -> GoalRecord:
    if goal is None or goal.status is not GoalStatus.ACTIVE:
        raise RuntimeRejection(RejectionKind.GOAL_STATE, "only an active goal can be paused")
    return attrs.evolve(goal, status=GoalStatus.PAUSED, updated_ms=now_ms)


def resumed(goal: GoalRecord | None, *, now_ms: int) -> GoalRecord:
    if goal is None or goal.status not in _RESUMABLE:
        raise RuntimeRejection(
            RejectionKind.GOAL_STATE, "only a paused, blocked or limited goal can be resumed"
        )
    return attrs.evolve(goal, status=GoalStatus.ACTIVE, updated_ms=now_ms)


def after_cycle(
    goal: GoalRecord, outcome: RunOutcome, progress: GoalProgress | None, *, now_ms: int
) -> GoalRecord | None:
    """The goal after one autonomous cycle, or ``None`` if the cycle does not count (it was
    cancelled, e.g. preempted by a prompt)."""
    if outcome.state is RunState.CANCELLED:
        return None
    iterations = goal.iterations + 1
    tokens_used = goal.tokens_used
    if goal.token_budget is not None or outcome.usage.total_tokens:
        tokens_used = (tokens_used or 0) + outcome.usage.total_tokens
    if outcome.state is RunState.FAILED:
        status, reason = GoalStatus.BLOCKED, outcome.failure or "the goal cycle failed"
    else:
        progress = progress or GoalProgress()
        status, reason = progress.status, progress.reason
        if status is GoalStatus.PAUSED:
            status = GoalStatus.ACTIVE
    if status is GoalStatus.ACTIVE:
        if goal.token_budget is not None and (tokens_used or 0) >= goal.token_budget:
            status, reason = GoalStatus.LIMITED, "the token budget is used up"
        elif iterations >= MAX_GOAL_ITERATIONS:
            status, reason = GoalStatus.LIMITED, "the iteration limit was reached"
    if goal.status is not GoalStatus.ACTIVE and status is GoalStatus.ACTIVE:
        # Paused while the cycle ran: the pause stands.
        status = goal.status
    return attrs.evolve(
        goal,
        status=status,
        iterations=iterations,
        last_reason=bounded_text(reason) if reason else goal.last_reason,
        updated_ms=now_ms,
        tokens_used=tokens_used,
    )
