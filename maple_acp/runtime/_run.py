"""One run: a backend turn in its own cancel scope, its bounded ordered event stream, its
permission responders, and its retained terminal state."""

from __future__ import annotations

import logging
import traceback
from collections.abc import AsyncIterator, Callable

import trio

from maple_acp._groups import single_exception
from maple_acp._text import one_line
from maple_acp.model import ItemKind, TimelineItem, Usage
from maple_acp.runtime._attachments import Prompt
from maple_acp.runtime._backend import AgentBackend, GoalProgress, TurnFailed, TurnResult
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection, bounded_text
from maple_acp.runtime._event_queue import RUN_EVENT_QUEUE, RunEventQueue
from maple_acp.runtime._events import (
    RunEnded,
    RunEvent,
    RunKind,
    RunNotice,
    RunOutcome,
    RunState,
    StopReason,
    TitleChanged,
)
from maple_acp.runtime._journal import RunJournal
from maple_acp.runtime._outlet import RunHooks, RunOutlet
from maple_acp.runtime._permissions import PermissionAnswer, PermissionBroker
from maple_acp.runtime._steering import MAX_WAITING_STEERS, STEERING_SEPARATOR, SteeringInbox
from maple_acp.runtime._turn import Turn
from maple_acp.store import TaskStore

__all__ = ["RUN_EVENT_QUEUE", "Run"]

logger = logging.getLogger(__name__)

#: Frames of a backend's exception that its log line shows (the innermost ones).
MAX_LOGGED_FRAMES = 12
#: A failed run's reason in its end line: enough to say what went wrong, never a transcript.
MAX_LOGGED_REASON_CHARS = 200

#: Writing a run's final rows and usage after it ended, even when it was cancelled.
RUN_FINALIZE_BOUND_S = 5.0

OVERFLOW_NOTICE = "the run produced events faster than they were read; it was cancelled"


def user_message_id(run_id: str) -> str:
    """The id under which a prompt run's user message is stored and shown."""
    return f"{run_id}-u"


class Run:
    """A handle on one run. Read ``events()`` (exactly once) until ``RunEnded``; ``cancel()``;
    ``await wait()`` for the retained outcome; answer permission requests with ``answer``."""

    def __init__(
        self,
        *,
        run_id: str,
        task_id: str,
        kind: RunKind,
        hooks: RunHooks,
        store: TaskStore,
        make_turn: Callable[[RunOutlet], Turn],
        notices: tuple[tuple[str, str], ...] = (),
        queue: RunEventQueue | None = None,
    ) -> None:
        self.id = run_id
        #: ``(level, text)`` notices the runtime itself has for the user before the turn.
        self._notices = notices
        self.task_id = task_id
        self.kind = kind
        self._scope = trio.CancelScope()
        self._store = store
        # A child session's run hands its events to its parent's run instead (``_children``).
        self._queue = queue if queue is not None else RunEventQueue()
        #: Steering messages for this run's backend (only a prompt's run takes them).
        self.steering = SteeringInbox()
        self._journal = RunJournal(run_id=run_id, task_id=task_id, store=store, now_ms=hooks.now_ms)
        self._broker = PermissionBroker(run_id, self.cancel)
        self._outlet = RunOutlet(
            run_id=run_id,
            queue=self._queue,
            journal=self._journal,
            broker=self._broker,
            hooks=hooks,
            cancel_run=self.cancel,
            steering=self.steering,
        )
        self._turn = make_turn(self._outlet)
        self._done = trio.Event()
        self._outcome: RunOutcome | None = None
        self._result = TurnResult()
        #: What sees each batch as its consumer reads it (the lease's observers), if anything.
        self._tap: BatchTap | None = None

    # -- the caller's side -------------------------------------------------------------------

    @property
    def user_message_id(self) -> str:
        """The id of the user message a prompt run answers (admitted with the run)."""
        return user_message_id(self.id)

    def tap(self, tap: BatchTap) -> None:
        """Let ``tap`` see every batch as the consumer reads it (it returns the batch the
        consumer gets): set by the lease before anyone reads, for its observers."""
        self._tap = tap

    def events(self) -> AsyncIterator[RunEvent]:
        """The run's ordered events, ending with ``RunEnded``. Can be taken once."""
        if self._tap is not None:
            return _TappedEvents(self._queue.batch_reader(), self._tap)
        return self._queue.reader()

    def event_batches(self) -> AsyncIterator[list[RunEvent]]:
        """The same events as ``events()``, in lists: every event available at that moment
        (at least one, in order), so a consumer hands them on with one wake-up per batch. The
        last batch ends with ``RunEnded``. Can be taken once, and not together with
        ``events()``."""
        if self._tap is not None:
            return _TappedBatches(self._queue.batch_reader(), self._tap)
        return self._queue.batch_reader()

    def cancel(self) -> None:
        """Cancel this exact run; every pending permission request resolves as denied.
        Idempotent; no effect on an ended run."""
        self._broker.close()
        self.steering.close()
        self._queue.run_cancelled()
        self._scope.cancel()

    def answer(self, responder_id: str, answer: PermissionAnswer | None) -> bool:
        """Answer one of this run's permission requests with a :class:`PermissionAnswer`
        (``None``: fail closed). True if accepted. ``None``, an unknown or reused id, an id of
        another run, an unknown answer, or any answer after cancellation denies every pending
        request of this run, cancels it, and returns False."""
        return self._broker.answer(responder_id, answer)

    async def wait(self) -> RunOutcome:
        await self._done.wait()
        assert self._outcome is not None
        return self._outcome

    @property
    def outcome(self) -> RunOutcome | None:
        return self._outcome

    @property
    def ended(self) -> bool:
        return self._done.is_set()

    @property
    def usage(self) -> Usage:
        """This run's usage so far."""
        return self._outlet.usage

    @property
    def goal_progress(self) -> GoalProgress | None:
        """What the backend concluded about the goal in this run (goal cycles return it)."""
        return self._result.goal_progress

    @property
    def pending_permissions(self) -> tuple[str, ...]:
        return tuple(self._broker.pending_ids)

    # -- steering ----------------------------------------------------------------------------

    @property
    def takes_steering(self) -> bool:
        """A prompt's run that is neither cancelled nor past its last backend turn."""
        return (
            self.kind is RunKind.PROMPT
            and not self._done.is_set()
            and not self._scope.cancel_called
            and self.steering.open
        )

    async def admit_steering(self, text: str, *, now_ms: int) -> TimelineItem:
        """Write ``text`` to the history as a user message of this run, after what the run
        said so far, then hand it to the backend's ``Turn.steering()``. Call only when
        ``takes_steering`` (no checkpoint between). The write is shielded: once begun, the
        message is admitted even if the caller is cancelled meanwhile. ``RUN_ACTIVE`` when
        ``MAX_WAITING_STEERS`` are already waiting for the backend."""
        if self.steering.full:
            raise RuntimeRejection(
                RejectionKind.RUN_ACTIVE,
                f"the turn has not taken its last {MAX_WAITING_STEERS} steering messages yet",
            )
        item_id = self.steering.reserve(self.id)
        item = TimelineItem(
            item_id=item_id, kind=ItemKind.USER, created_ms=now_ms, run_id=self.id, text=text
        )
        try:
            with trio.CancelScope(shield=True):
                await self._journal.admit_user(item)
        except BaseException:
            self.steering.abandoned(item_id)
            raise
        self.steering.admitted(item)
        return item

    # -- driving -----------------------------------------------------------------------------

    async def drive(
        self,
        backend: AgentBackend,
        *,
        on_end: Callable[[Run], None],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the backend turn. Returns (never raises for the turn's own failure or
        cancellation) once the outcome is retained and the final rows are written; an outer
        cancellation still propagates after that."""
        state: RunState | None = None
        failure: str | None = None
        logged_reason = ""
        started_at = trio.current_time()
        logger.info("%s run %s of task %s started", self.kind.value, self.id, self.task_id)
        try:
            with self._scope:
                task_status.started()
                try:
                    for level, text in self._notices:
                        await self._turn.notice(level, text)
                    self._result = await self._run_backend(backend)
                    state = RunState.COMPLETED
                except TurnFailed as exc:
                    state, failure = RunState.FAILED, self._safe(str(exc))
                    logged_reason = _logged_reason(exc)
                except Exception as exc:
                    failure = self._safe(_failure_text(exc, self.id))
                    state = RunState.FAILED
                    logged_reason = _logged_reason(exc)
        finally:
            # However the turn ended, a steering message from now on finds no run to take it.
            self.steering.close()
            overflowed = self._outlet.overflowed
            if state is None or overflowed:
                state = RunState.CANCELLED
                failure = None
            self._broker.close()
            with trio.CancelScope(shield=True):
                # Every tool's final state reaches the caller, even if writing it times out.
                tail: list[RunEvent] = list(self._journal.close_open_tools(state, failure))
                tail.extend(self._outlet.open_compactions())
                with trio.move_on_after(RUN_FINALIZE_BOUND_S):
                    title = await self._write_final_rows()
                    if title is not None:
                        tail.append(TitleChanged(self.id, title))
                completed = state is RunState.COMPLETED
                self._outcome = RunOutcome(
                    state=state,
                    failure=failure,
                    usage=self._outlet.usage,
                    usage_reported=self._outlet.usage_reported,
                    overflowed=overflowed,
                    stop_reason=self._result.stop_reason if completed else StopReason.END_TURN,
                )
                if overflowed:
                    tail.append(RunNotice(self.id, OVERFLOW_NOTICE, terminal=True, level="error"))
                if failure is not None:
                    tail.append(RunNotice(self.id, failure, terminal=True, level="error"))
                tail.append(RunEnded(self.id, self._outcome))
                self._log_end(trio.current_time() - started_at, logged_reason)
                self._queue.close(tail)
                self._done.set()
                on_end(self)

    async def _run_backend(self, backend: AgentBackend) -> TurnResult:
        """The backend's turn, then one follow-up turn per batch of steering messages it did
        not take (each batch as the follow-up's prompt), until none is left; the last turn's
        result is the run's."""
        result = _turn_result(await backend.run_turn(self._turn))
        while True:
            await self.steering.settle()
            carried = self.steering.take()
            if not carried:
                # Decided with no checkpoint since the last check: no message can slip in.
                self.steering.close()
                return result
            self._turn = await self._follow_up(carried)
            result = _turn_result(await backend.run_turn(self._turn))

    async def _follow_up(self, carried: tuple[TimelineItem, ...]) -> Turn:
        """The next backend turn of this run: ``carried`` is its message, and its history is
        the task's stored history without that message and without what still waits to be
        taken through ``steering()`` (each message reaches the backend once)."""
        await self._journal.flush()
        self._journal.interrupt()
        stored = await self._store.history(self.task_id)
        skip = self.steering.pending_ids() | {item.item_id for item in carried}
        history = tuple(
            item for item in stored if item.run_id != self.id or item.item_id not in skip
        )
        prompt = Prompt(STEERING_SEPARATOR.join(item.text for item in carried))
        logger.info("run %s: a follow-up turn for %d steering messages", self.id, len(carried))
        return self._turn.follow_up(prompt, history)

    def _log_end(self, duration_s: float, failure_reason: str) -> None:
        outcome = self._outcome
        assert outcome is not None
        usage = outcome.usage
        # The stop reason, or why it failed: only what quotes nobody (``_logged_reason``).
        if outcome.state is RunState.COMPLETED:
            reason = f" ({outcome.stop_reason.value})"
        elif outcome.state is RunState.FAILED:
            reason = f" ({self._safe(one_line(failure_reason, MAX_LOGGED_REASON_CHARS))})"
        elif outcome.overflowed:
            reason = " (the event queue overflowed)"
        else:
            reason = ""
        tokens = (
            f"tokens in {usage.input_tokens} out {usage.output_tokens} total {usage.total_tokens}"
            if outcome.usage_reported
            else "tokens not reported"
        )
        logger.info(
            "%s run %s of task %s ended: %s%s in %.3f s, %d updates, %s",
            self.kind.value,
            self.id,
            self.task_id,
            outcome.state.value,
            reason,
            duration_s,
            self._queue.sent,
            tokens,
        )

    def _safe(self, text: str) -> str:
        # Redacted before it is cut, so that no part of a relay value survives the cut.
        return bounded_text(self._outlet.hooks.redactor.text(text))

    async def _write_final_rows(self) -> str | None:
        """Write what is left of the run; returns the title the runtime gave the task, if
        this prompt run ended with the task still untitled."""
        try:
            await self._journal.flush()
            usage = self._outlet.usage
            if usage != Usage() or self.kind is RunKind.PROMPT:
                await self._journal.record_usage(usage)
            if self.kind is RunKind.PROMPT:
                return await self._outlet.hooks.auto_title()
        except Exception:
            logger.warning("could not write the final rows of run %s", self.id, exc_info=True)
        return None


#: Sees one batch of a run's events as its consumer reads it; returns what the consumer gets.
BatchTap = Callable[[list[RunEvent]], list[RunEvent]]


class _TappedBatches:
    """A run's batches, each through the tap (one call per batch: the streaming path)."""

    def __init__(self, batches: AsyncIterator[list[RunEvent]], tap: BatchTap) -> None:
        self._batches = batches
        self._tap = tap

    def __aiter__(self) -> _TappedBatches:
        return self

    async def __anext__(self) -> list[RunEvent]:
        return self._tap(await self._batches.__anext__())


class _TappedEvents:
    """A run's events one at a time, read in tapped batches."""

    def __init__(self, batches: AsyncIterator[list[RunEvent]], tap: BatchTap) -> None:
        self._batches = _TappedBatches(batches, tap)
        self._ready: list[RunEvent] = []
        self._next = 0

    def __aiter__(self) -> _TappedEvents:
        return self

    async def __anext__(self) -> RunEvent:
        while self._next >= len(self._ready):
            self._ready = await self._batches.__anext__()
            self._next = 0
        event = self._ready[self._next]
        self._next += 1
        return event


def _logged_reason(exc: Exception) -> str:
    """Why a run failed, for the log: a backend's own line when it says the line quotes
    nobody (``TurnFailed(loggable=True)``), else only the kind of failure."""
    single = single_exception(exc)
    if isinstance(single, TurnFailed):
        return str(single) if single.loggable else "the backend failed the turn"
    return f"the backend raised {type(single).__name__}"


def _failure_text(exc: Exception, run_id: str) -> str:
    """The failure text of a backend exception: a ``TurnFailed`` raised inside the backend's
    own nursery (so wrapped in a group) keeps its text; anything else is generic."""
    single = single_exception(exc)
    if isinstance(single, TurnFailed):
        return str(single)
    # Where it was raised, for whoever maintains the backend, but never its message: that may
    # quote the prompt, a file or a relay value. The frames show code only.
    frames = traceback.extract_tb(single.__traceback__)[-MAX_LOGGED_FRAMES:]
    logger.warning(
        "agent backend raised %s in run %s, at (innermost last):\n%s",
        type(single).__name__,
        run_id,
        "".join(traceback.format_list(frames)).rstrip(),
    )
    return f"the agent backend failed: {type(exc).__name__}"


def _turn_result(returned: object) -> TurnResult:
    """What ``run_turn`` returned, checked: a wrong type fails the run (through the generic
    failure path) rather than passing for a finished answer."""
    if returned is None:
        return TurnResult()
    if not isinstance(returned, TurnResult):
        raise TypeError(f"run_turn returned {type(returned).__name__}, not a TurnResult")
    if not isinstance(returned.stop_reason, StopReason):
        raise TypeError("TurnResult.stop_reason is not a StopReason")
    return returned
