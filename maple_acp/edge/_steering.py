"""Steering: ``_session/steering``, a message added to the session's running turn.

The message is checked like a prompt's blocks (a refused block is ``-32602`` before the
session is looked up), then the runtime decides (``SessionLease.steer``): while a prompt's run
works, the message is admitted durably to the history and handed to that run's backend
(``injected``); with no prompt turn running it is not admitted, and either a new turn starts
with it (``startedNewTurn``) or, when the client asked with ``_meta.steering.idleBehavior:
"promptRequired"``, nothing happens (``promptRequired``, reason ``noRunningTurn``) and the
client sends it as a ``session/prompt``.

A turn a steering message started has no ``session/prompt`` answer: its updates stream as a
prompt's would, after the steering answer, and its end is a ``session_info_update`` whose
``_meta.steering.turnEnded`` carries the stop reason and usage that answer would have had.

Resource handling: a started turn is pumped by a task in the connection's nursery, begun once
the steering answer is queued; it runs inside the session's update scope. Error handling: a
closed connection or a closed session cancels that turn. Cancellation: a ``session/cancel`` or
``session/close`` that arrives while the message waits for a prompt's run to start or end
refuses it (``-32800`` / ``-32002``) with nothing admitted; once admitted it stays admitted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from maple_acp.edge._client import ClientChannel
from maple_acp.edge._errors import unknown_session
from maple_acp.edge._observing import own_run_outcome
from maple_acp.edge._prompt import read_prompt
from maple_acp.edge._session import EdgeSession, SessionClosed
from maple_acp.edge._sessions import SessionTable
from maple_acp.rpc import ConnectionClosed, admitted, after_answer, request_arrival
from maple_acp.runtime import (
    PromptCapabilities,
    RejectionKind,
    Run,
    RunState,
    RuntimeRejection,
    SteeringOutcome,
)
from maple_acp.wire import INVALID_PARAMS, REQUEST_CANCELLED, ProtocolError, SteeringRequest

logger = logging.getLogger(__name__)

#: The one idle behaviour a client may ask for (any other value is refused, not guessed at).
PROMPT_REQUIRED: Final = "promptRequired"
#: The reason given with ``promptRequired``.
NO_RUNNING_TURN: Final = "noRunningTurn"


def prompt_required(meta: dict[str, Any] | None) -> bool:
    """Whether ``_meta.steering.idleBehavior`` asks for ``promptRequired``; ``-32602`` for a
    ``steering`` entry that is not an object or an idle behaviour this agent does not know."""
    if meta is None or "steering" not in meta:
        return False
    steering = meta["steering"]
    if not isinstance(steering, dict):
        raise ProtocolError(INVALID_PARAMS, "_meta.steering: expected an object")
    behavior = steering.get("idleBehavior")
    if behavior is None:
        return False
    if behavior != PROMPT_REQUIRED:
        raise ProtocolError(
            INVALID_PARAMS, f'_meta.steering.idleBehavior: expected "{PROMPT_REQUIRED}"'
        )
    return True


class SteeringFlow:
    """``_session/steering`` for one connection. ``pump`` sends a run's events (the prompt
    turns' pump); ``nursery`` is the connection's, where a started turn is pumped."""

    def __init__(
        self,
        table: SessionTable,
        channel: ClientChannel,
        *,
        pump: Callable[[EdgeSession, Run], Awaitable[RunState]],
        nursery: trio.Nursery,
    ) -> None:
        self._table = table
        self._channel = channel
        self._pump = pump
        self._nursery = nursery

    async def steer(self, request: SteeringRequest) -> object:
        # The blocks first, as for a prompt: a refused block is bad params whatever the session.
        # Text and resource links only: an injected message has no place for images yet.
        message = read_prompt(request.prompt, PromptCapabilities())
        only_inject = prompt_required(request.meta)
        # An observing window steers the one lease's turn as the holder does.
        session = self._table.live(request.session_id)
        arrival = request_arrival()
        lease = session.lease
        while True:
            with session.abortable() as waiting:
                if session.cancelled_since(arrival):
                    waiting.cancel()
                # Decided once the turn it joins is known (the running one, or the prompt
                # holding the slot): later requests about the session need not wait for it.
                outcome = await lease.steer(message, decided=admitted)
            if waiting.cancelled_caught:
                if session.closing:
                    raise unknown_session()
                raise ProtocolError(
                    REQUEST_CANCELLED, "the turn was cancelled before it took the message"
                )
            if outcome is SteeringOutcome.INJECTED:
                logger.info("session %s: steering message injected", session.id)
                return session.dialect.steering_answer("injected", None)
            if only_inject:
                return session.dialect.steering_answer("promptRequired", NO_RUNNING_TURN)
            was_locked = session.model_locked
            try:
                with lease.claim_prompt() as claim:
                    # The new turn holds the slot: a prompt after this message is refused.
                    admitted()
                    run = await lease.start_run(message, claim=claim)
            except RuntimeRejection as exc:
                # A prompt took the slot since: steer that one.
                if exc.kind is RejectionKind.RUN_ACTIVE:
                    continue
                raise
            break
        if session.cancelled_since(arrival):
            # A cancel or close arrived while the turn was being admitted.
            run.cancel()
        logger.info("session %s: a steering message started a turn", session.id)

        async def pump_after_answer() -> None:
            if session.observer is not None:
                self._nursery.start_soon(self._follow_started, session, run, message.text)
            else:
                self._nursery.start_soon(self._pump_started, session, run, was_locked)

        after_answer(pump_after_answer)
        return session.dialect.steering_answer("startedNewTurn", None)

    async def _pump_started(self, session: EdgeSession, run: Run, was_locked: bool) -> None:
        """Send the updates of a turn a steering message started, then its end."""
        try:
            with session.update_scope():
                try:
                    await self._send_turn(session, run, was_locked)
                # Raised inside the pump's nursery, a closed connection arrives as a group:
                # the client is gone, which ends this turn and nothing else.
                except* ConnectionClosed:
                    pass
                finally:
                    # Ended, cancelled or gone: the run must not outlive its pump.
                    run.cancel()
        except SessionClosed:
            run.cancel()

    async def _follow_started(self, session: EdgeSession, run: Run, text: str) -> None:
        """A turn an observing window's steering message started: the holder's side reads and
        shows it, this window follows it through its feed; then its end, as for the holder."""
        observer = session.observer
        assert observer is not None
        observer.hand_over(run, text)
        try:
            with session.update_scope():
                try:
                    outcome = await own_run_outcome(observer, run)
                    usage = outcome.usage if outcome.usage_reported else None
                    ended = session.projector.turn_ended(outcome.state, usage, outcome.stop_reason)
                    await self._channel.send_many(session.id, ended)
                except ConnectionClosed:
                    run.cancel()
        except SessionClosed:
            run.cancel()

    async def _send_turn(self, session: EdgeSession, run: Run, was_locked: bool) -> None:
        if not was_locked:
            await self._channel.send(session.id, session.projector.config_update(session.options()))
        state = await self._pump(session, run)
        outcome = await run.wait()
        # Every update of the run is queued before its end, as before a prompt's answer.
        usage = outcome.usage if outcome.usage_reported else None
        ended = session.projector.turn_ended(state, usage, outcome.stop_reason)
        await self._channel.send_many(session.id, ended)
