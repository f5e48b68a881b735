"""The goal flow: ``_session/goal`` control, and what a session publishes outside any prompt
(goal snapshots, autonomous cycles, an observing window's prompts, mode changes, background
commands' output and ends).

A goal is session state, not a prompt: a cycle's run is pumped like a prompt's, in a task of
its own (as is the run an observing window's prompt started, which its holder shows), so that
a long cycle never holds back the snapshots (a pause, a clear) published while it runs.

Resource handling: a session's event stream is read by one task in the connection's nursery
(started when the session opens); each cycle's pump runs in a nursery of that task. Error
handling: a closed connection ends the stream quietly; a lease the runtime revoked is handed
to ``forget``. Cancellation: the session's update scope (a close, the connection's end)
cancels the stream and every cycle pump.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from maple_acp.edge._client import ClientChannel
from maple_acp.edge._observing import admitted_message
from maple_acp.edge._queue import queue_changed
from maple_acp.edge._session import EdgeSession, SessionClosed
from maple_acp.edge._sessions import SessionTable
from maple_acp.rpc import ConnectionClosed
from maple_acp.runtime import (
    BackgroundEnded,
    BackgroundOutput,
    CycleStarted,
    GoalChanged,
    LeaseRevoked,
    ModeChanged,
    PromptStarted,
    QueueChanged,
    Run,
    RunState,
)
from maple_acp.wire import (
    INVALID_PARAMS,
    QUEUE_CHANGED_METHOD,
    GoalAction,
    GoalControlRequest,
    GoalControlResponse,
    ProtocolError,
)

logger = logging.getLogger(__name__)

#: The goal actions the runtime implements; only these are advertised and accepted.
GOAL_ACTIONS: Final[tuple[GoalAction, ...]] = ("set", "pause", "resume", "clear")


class GoalFlow:
    """Goal control and the out-of-prompt event stream of each session of one connection.
    ``pump`` sends a run's events (the prompt turns' pump); ``forget`` drops a session whose
    lease the runtime revoked (the closer's)."""

    def __init__(
        self,
        table: SessionTable,
        channel: ClientChannel,
        *,
        pump: Callable[[EdgeSession, Run], Awaitable[RunState]],
        forget: Callable[[EdgeSession], None],
    ) -> None:
        self._table = table
        self._channel = channel
        self._pump = pump
        self._forget = forget

    async def control(self, request: GoalControlRequest) -> GoalControlResponse:
        session = self._table.get(request.session_id)
        if session is None or session.closing:
            raise ProtocolError(INVALID_PARAMS, "sessionId: unknown session")
        if request.action not in GOAL_ACTIONS:
            raise ProtocolError(INVALID_PARAMS, "action: not supported")
        lease = session.lease
        # Refusals are the runtime's (INVALID_GOAL is -32602 in the one table, edge/_errors).
        with lease.operation():
            if request.action == "set":
                objective = (request.objective or "").strip()
                if not objective:
                    raise ProtocolError(INVALID_PARAMS, "objective: must not be blank")
                await lease.set_goal(objective)
            elif request.action == "pause":
                await lease.pause_goal()
            elif request.action == "resume":
                await lease.resume_goal()
            else:
                await lease.clear_goal()
        return GoalControlResponse()

    async def pump_session_events(self, session: EdgeSession) -> None:
        """Forward what happens outside any prompt until the lease ends."""
        events = session.lease.session_events()
        gone = False
        try:
            with session.update_scope():
                try:
                    async with trio.open_nursery() as cycles:
                        async for event in events:
                            if isinstance(event, CycleStarted):
                                cycles.start_soon(self._pump_run, session, event.run, None)
                            elif isinstance(event, PromptStarted):
                                cycles.start_soon(self._pump_run, session, event.run, event)
                            elif isinstance(event, LeaseRevoked):
                                break
                            else:
                                await self.forward(session, event)
                        cycles.cancel_scope.cancel()
                # Raised inside the nursery, a closed connection arrives as a group: the
                # client is gone, which ends this stream and nothing else.
                except* ConnectionClosed:
                    gone = True
        except SessionClosed:
            return
        if not gone:
            self._forget(session)

    async def forward(
        self,
        session: EdgeSession,
        event: GoalChanged | ModeChanged | BackgroundOutput | BackgroundEnded | QueueChanged,
    ) -> None:
        """Send one session event outside any prompt (to the holder, or to a window that
        follows the session)."""
        channel = self._channel
        projector = session.projector
        if isinstance(event, GoalChanged):
            await channel.send(session.id, projector.goal(event.goal))
        elif isinstance(event, ModeChanged):
            await channel.send_many(
                session.id, projector.mode_change(event.mode.id, session.options())
            )
        elif isinstance(event, BackgroundOutput):
            await channel.send_many(session.id, projector.shell_output(event.output))
        elif isinstance(event, QueueChanged):
            await channel.notify(
                session.id, QUEUE_CHANGED_METHOD, queue_changed(session.id, event.entries)
            )
        else:
            await channel.send(session.id, projector.tool(event.tool_id, event.tool))

    async def _pump_run(
        self, session: EdgeSession, run: Run, prompted: PromptStarted | None
    ) -> None:
        """Send a goal cycle's run, or (``prompted``) the run an observing window's prompt
        started, its user message first: that window follows it through its feed, and answers
        once this showed the run's end."""
        try:
            if prompted is not None:
                projector = session.projector
                await self._channel.send_many(
                    session.id,
                    admitted_message(projector, run.id, run.user_message_id, prompted.text),
                )
                # Its message may be the session's first, which locks the model: the holder
                # is shown the options as they are now, as after a first prompt of its own.
                await self._channel.send(session.id, projector.config_update(session.options()))
            await self._pump(session, run)
        except* ConnectionClosed:
            run.cancel()
        finally:
            if prompted is not None:
                prompted.shown.set()
