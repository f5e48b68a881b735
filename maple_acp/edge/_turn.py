"""The prompt turn: ``session/prompt``, the pump that sends a run's events as updates, and the
permission question.

A prompt's path: its blocks become one ``Prompt`` (refused blocks are ``-32602`` before the session
is looked up), the session's prompt slot is claimed (or the prompt waits its turn in the
session's queue, and is answered cancelled if withdrawn there), the trust dialog runs before
the first prompt of a session, the runtime admits the message and starts a run, the pump sends every
event of that run, and the answer (stop reason and this turn's usage) is queued only once
every update of the run is on the wire. Which update each event becomes, the permission
question's shape and the answer's are the session's dialect's.

Resource handling: a run's permission questions live in a nursery of the pump. Error handling:
an oversized update ends the turn (not the connection) with a visible notice; a failed or
malformed permission answer fails closed. Cancellation: a cancel or close reaches the prompt
at whatever stage it is (trust question, admission, run); a cancelled request lets its run
finish ending, bounded, so the session takes the next prompt at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import attrs
import trio

from maple_acp.edge._asking import ask_permission
from maple_acp.edge._children import CHILD_REPORTS
from maple_acp.edge._client import ClientChannel
from maple_acp.edge._closing import CLOSE_DEADLINE_S
from maple_acp.edge._dialect import Projection
from maple_acp.edge._observing import own_run_outcome
from maple_acp.edge._prompt import read_prompt
from maple_acp.edge._session import AnswerPlace, EdgeSession, SessionClosed
from maple_acp.edge._sessions import SessionTable
from maple_acp.rpc import (
    OutboundFrameTooLarge,
    admitted,
    after_answer,
    request_arrival,
)
from maple_acp.runtime import (
    PermissionRequest,
    Prompt,
    PromptCapabilities,
    PromptClaim,
    Run,
    RunEnded,
    RunEvent,
    RunState,
    StopReason,
    TextChunk,
    ThoughtChunk,
    Withdrawn,
)
from maple_acp.wire import PromptRequest, v2

logger = logging.getLogger(__name__)


class PromptTurns:
    """Every prompt turn of one connection, and the pump every run's events go through.
    ``settle_trust`` asks the trust question when a session's project needs a decision
    (False: the turn is cancelled)."""

    def __init__(
        self,
        table: SessionTable,
        channel: ClientChannel,
        *,
        settle_trust: Callable[[EdgeSession], Awaitable[bool]],
        nursery: trio.Nursery,
        accepts: PromptCapabilities | None = None,
    ) -> None:
        self._table = table
        self._channel = channel
        self._settle_trust = settle_trust
        #: Where a turn answered on acceptance goes on (the connection's nursery).
        self._nursery = nursery
        #: What the host's backend takes in a prompt besides text and resource links.
        self._accepts = accepts or PromptCapabilities()

    async def prompt(self, request: PromptRequest | v2.V2PromptRequest) -> object:
        # The blocks first: a refused block is bad params whatever the session.
        prompt = read_prompt(request.prompt, self._accepts)
        # An observing window's prompt takes the holder's path below (the same lease, slot and
        # queue); only its run is read on the holder's side (``_observed``).
        session = self._table.live(request.session_id)
        arrival = request_arrival()
        key = request.idempotency_key if isinstance(request, v2.V2PromptRequest) else None
        if key is not None:
            return await session.prompt_keys.answer(
                session.lease,
                key,
                session.dialect.acceptance_answer,
                partial(self._prompt, session, attrs.evolve(prompt, idempotency_key=key), arrival),
            )
        return await self._prompt(session, prompt, arrival)

    async def _prompt(self, session: EdgeSession, prompt: Prompt, arrival: int) -> object:
        order = _AnswerOrder(session)
        try:
            if not session.dialect.answers_on_acceptance:
                result = await self._queued_turn(session, prompt, arrival, None, order)

                async def answer_queued() -> None:
                    order.answered()

                # A prompt waiting for this turn starts once this answer is on its way, so its
                # updates never come before it.
                after_answer(answer_queued)
                return result
            # The answer leaves once the message is inserted; the turn goes on in the
            # connection's nursery, and ends in updates. Its updates (but the echo of the
            # user message) wait until the answer is queued: the client learns the turn's
            # message id before anything of the turn arrives.
            queued = trio.Event()

            async def accepted_queued() -> None:
                queued.set()
                order.answered()

            after_answer(accepted_queued)
            try:
                answer: object = await self._nursery.start(
                    self._accepted_turn, session, prompt, arrival, queued, order
                )
            except BaseException:
                queued.set()  # no answer is coming: a turn that started need not wait
                raise
            return answer
        except BaseException:
            # Set by the request's own task, right before its error is queued: the prompt
            # behind it (withdrawn too, say) is answered after it.
            order.answered()
            raise

    async def _accepted_turn(
        self,
        session: EdgeSession,
        prompt: Prompt,
        arrival: int,
        queued: trio.Event,
        order: _AnswerOrder,
        *,
        task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A turn whose prompt is answered on acceptance. Before that, its errors (and its
        cancellation) are the request's; after it, a failure ends the turn and is logged."""
        acceptance = _Acceptance(task_status, queued)
        try:
            await self._queued_turn(session, prompt, arrival, acceptance, order)
        except Exception as exc:
            if not acceptance.accepted:
                raise
            # The session closed, or the client went away: nothing is left to tell.
            logger.debug("a turn ended early after its prompt was accepted: %r", exc)

    async def _queued_turn(
        self,
        session: EdgeSession,
        prompt: Prompt,
        arrival: int,
        acceptance: _Acceptance | None,
        order: _AnswerOrder,
    ) -> object:
        answer = session.dialect.prompt_answer
        if session.cancelled_since(arrival):
            # A cancel written after this prompt already acted (it stood for an earlier one
            # held behind the same requests): this prompt was never to run.
            admitted()
            return answer(RunState.CANCELLED)

        # The runtime's prompt slot, or a place in the session's queue behind the running
        # turn (RUN_ACTIVE, -32600, when the queue is full). Either way the prompt has
        # decided: requests after it about the session may decide.
        async with session.lease.queue_prompt(
            prompt.text, decided=admitted, window=session
        ) as claim:
            if isinstance(claim, Withdrawn):
                # Withdrawn while it waited (a cancel, a remove, a clear, the session's end):
                # nothing of it was admitted. Answered after this window's prompts withdrawn
                # before it (another window's are answered on their own connection).
                order.place = session.withdrawal_place(claim.order)
                order.withdrawn = claim.order
                with trio.move_on_after(CLOSE_DEADLINE_S):
                    await order.place.before.wait()
                return answer(RunState.CANCELLED)
            order.place = session.turn_place()
            # On v1 a turn starts once the answer before it is on its way (bounded: a turn
            # that will not answer does not hold the next one for ever).
            with trio.move_on_after(CLOSE_DEADLINE_S):
                await order.place.before.wait()
            return await self._claimed(session, claim, prompt, arrival, acceptance)

    async def _claimed(
        self,
        session: EdgeSession,
        claim: PromptClaim,
        prompt: Prompt,
        arrival: int,
        acceptance: _Acceptance | None,
    ) -> object:
        answer = session.dialect.prompt_answer
        # A model that does not see images is refused before the trust question.
        await session.lease.check_images(prompt)
        try:
            with session.update_scope():
                return await self._turn(session, claim, prompt, arrival, acceptance)
        except SessionClosed:
            return answer(RunState.CANCELLED)
        # A closed session's pump is cancelled from outside; the turn ends cancelled, and a
        # child it announced is shown ended before that answer (the runtime ended it).
        await session.children.settle(self._channel)
        return answer(RunState.CANCELLED)

    async def _turn(
        self,
        session: EdgeSession,
        claim: PromptClaim,
        prompt: Prompt,
        arrival: int,
        acceptance: _Acceptance | None,
    ) -> object:
        lease = session.lease
        answer = session.dialect.prompt_answer
        with session.abortable() as before_run:
            if session.cancelled_since(arrival):
                before_run.cancel()
            # Before the first prompt of each session, new or loaded: a skill may have been
            # added to the project since the task was last used.
            if not session.trust_settled and not await self._settle_trust(session):
                # Cancel admits no user message and saves nothing.
                return answer(RunState.CANCELLED)
            session.trust_settled = True
        if before_run.cancelled_caught or session.cancelled_since(arrival):
            return answer(RunState.CANCELLED)
        was_locked = session.model_locked
        run = await lease.start_run(prompt, claim=claim)
        if session.cancelled_since(arrival):
            # A cancel or close arrived while the run was being admitted; it found no run.
            run.cancel()
        if session.observer is not None:
            return await self._observed(session, run, prompt, acceptance, was_locked)
        if acceptance is not None:
            acceptance.accept(session.dialect.acceptance_answer(run.user_message_id))
        try:
            await self._channel.send_many(
                session.id, session.projector.accepted(run.user_message_id, prompt.text)
            )
            if acceptance is not None:
                await acceptance.queued.wait()
            if not was_locked:
                await self._channel.send(
                    session.id, session.projector.config_update(session.options())
                )
            state = await self.pump(session, run)
        except BaseException:
            run.cancel()
            if not session.stopped:
                # Only the request was cancelled ($/cancel_request): let the run finish ending
                # (bounded) so that the session takes a new prompt right after the answer.
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_DEADLINE_S):
                    await run.wait()
            raise
        outcome = await run.wait()
        # Every update of the run must be on the wire before the prompt's answer.
        await self._channel.drain()
        if acceptance is not None:
            return None  # answered on acceptance; the run's last update ended the turn
        usage = outcome.usage if outcome.usage_reported else None
        return answer(state, usage, outcome.stop_reason)

    async def _observed(
        self,
        session: EdgeSession,
        run: Run,
        prompt: Prompt,
        acceptance: _Acceptance | None,
        was_locked: bool,
    ) -> object:
        """The turn of an observing window's prompt: the holder's side reads its run and this
        window follows it through its feed (its user message included: no echo here). The
        answer comes once the feed showed the run's end."""
        observer = session.observer
        assert observer is not None
        try:
            try:
                if acceptance is not None:
                    acceptance.accept(session.dialect.acceptance_answer(run.user_message_id))
                    # Nothing of the run is read before the answer is queued.
                    await acceptance.queued.wait()
            finally:
                # The run's one reader is the holder's side, whatever became of this request.
                observer.hand_over(run, prompt.text)
            if not was_locked:
                await self._channel.send(
                    session.id, session.projector.config_update(session.options())
                )
            outcome = await own_run_outcome(observer, run)
        except BaseException:
            run.cancel()
            raise
        await self._channel.drain()
        if acceptance is not None:
            return None  # answered on acceptance; the feed's last update ended the turn
        usage = outcome.usage if outcome.usage_reported else None
        return session.dialect.prompt_answer(outcome.state, usage, outcome.stop_reason)

    async def pump(self, session: EdgeSession, run: Run) -> RunState:
        """Send every event of ``run`` as it comes, framed by the dialect's run updates
        (v2's ``state_update``; none in v1); return the run's final state."""
        projector = session.projector
        await self._channel.send_many(session.id, projector.run_started())
        state, reason = await self._pump_events(session, run)
        # After every update of the run, and after its permission questions ended.
        await self._channel.send_many(session.id, projector.run_ended(state, reason))
        return state

    async def _pump_events(self, session: EdgeSession, run: Run) -> tuple[RunState, StopReason]:
        """Send every event of ``run`` as it comes; return the run's final state and reason.

        Events arrive in batches (everything queued at that moment). Consecutive text chunks
        of a batch for the same message become one chunk (their text joined in order: a
        client sees the same text in fewer frames when tokens come faster than it reads;
        nothing waits for more). The chunks' finished lines are handed to the peer together,
        one hand-off per run of chunks; any other event first sends the lines before it, so
        the order holds."""
        projector = session.projector
        chunk_kinds = session.dialect.chunk_kinds
        dropped = False
        async with trio.open_nursery() as permissions:
            try:
                async for batch in run.event_batches():
                    lines: list[bytes] = []
                    # The chunk being joined: its kind, message id and text pieces.
                    kind: Any = None
                    message_id = ""
                    texts: list[str] = []
                    for event in batch:
                        event_kind = chunk_kinds.get(type(event))
                        if event_kind is not None:
                            chunk: TextChunk | ThoughtChunk = event  # type: ignore[assignment]
                            if event_kind == kind and chunk.message_id == message_id:
                                texts.append(chunk.text)
                                continue
                            if texts:
                                _add_lines(lines, projector, kind, message_id, texts)
                            kind, message_id, texts = event_kind, chunk.message_id, [chunk.text]
                            continue
                        if texts:
                            _add_lines(lines, projector, kind, message_id, texts)
                            kind, texts = None, []
                        if lines:
                            dropped |= await self._send_lines(session, run, lines)
                            lines = []
                        if isinstance(event, RunEnded):
                            # A turn that lost an update did not end normally, even if its
                            # run completed before the cancel reached it.
                            outcome = event.outcome
                            state = RunState.CANCELLED if dropped else outcome.state
                            return state, outcome.stop_reason
                        if isinstance(event, PermissionRequest):
                            permissions.start_soon(self._ask_permission, session, event)
                        elif isinstance(event, CHILD_REPORTS):
                            await session.children.relay(
                                self._channel, projector, event, permissions
                            )
                        else:
                            dropped |= await self._send_event(session, run, event)
                    if texts:
                        _add_lines(lines, projector, kind, message_id, texts)
                    if lines:
                        dropped |= await self._send_lines(session, run, lines)
            finally:
                permissions.cancel_scope.cancel()
        outcome = await run.wait()
        return outcome.state, outcome.stop_reason

    async def _send_lines(self, session: EdgeSession, run: Run, lines: list[bytes]) -> bool:
        """Hand finished text lines to the peer; True if one was too large (turn ended)."""
        try:
            await self._channel.send_lines(session.id, lines)
        except OutboundFrameTooLarge as exc:
            await self._oversize(session, run, exc)
            return True
        return False

    async def _send_event(self, session: EdgeSession, run: Run, event: RunEvent) -> bool:
        """Send the update of one event other than text; True if it was too large."""
        update = session.projector.event(event)
        try:
            if isinstance(update, list):
                await self._channel.send_many(session.id, update)
            elif update is not None:
                await self._channel.send(session.id, update)
        except OutboundFrameTooLarge as exc:
            await self._oversize(session, run, exc)
            return True
        return False

    async def _oversize(self, session: EdgeSession, run: Run, exc: Exception) -> None:
        # One oversized update ends the turn, not the connection.
        logger.warning("ending a turn: %s", exc)
        run.cancel()
        await self._channel.send_many(
            session.id,
            session.projector.notice(
                f"{run.id}-oversize", "An update was too large to send; the turn was ended."
            ),
        )

    async def _ask_permission(self, session: EdgeSession, event: PermissionRequest) -> None:
        """Ask this connection's client (each observing window asks its own as well)."""
        await ask_permission(self._channel, session, event)


class _AnswerOrder:
    """A prompt's place among its session's answers, once it has one: as it takes the slot,
    or as it is withdrawn from the queue (``withdrawn``: its order)."""

    __slots__ = ("place", "session", "withdrawn")

    def __init__(self, session: EdgeSession) -> None:
        self.session = session
        self.place: AnswerPlace | None = None
        self.withdrawn = 0

    def answered(self) -> None:
        if self.place is not None:
            self.place.answered.set()
        if self.withdrawn:
            self.session.withdrawal_answered(self.withdrawn)


class _Acceptance:
    """A turn answered on acceptance: ``accept`` hands the answer to the prompt request;
    ``queued`` is set once that answer is queued on the wire (or will never be)."""

    def __init__(self, task_status: trio.TaskStatus[object], queued: trio.Event) -> None:
        self._task_status = task_status
        self.queued = queued
        self.accepted = False

    def accept(self, answer: object) -> None:
        self.accepted = True
        self._task_status.started(answer)


def _add_lines(
    lines: list[bytes], projector: Projection, kind: Any, message_id: str, texts: list[str]
) -> None:
    """Append the finished lines of one message's joined text pieces."""
    text = texts[0] if len(texts) == 1 else "".join(texts)
    line = projector.text_line(kind, message_id, text)
    if line is not None:
        lines.append(line)
    else:
        lines.extend(projector.text(kind, message_id, text))
