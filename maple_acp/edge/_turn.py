"""The prompt turn: ``session/prompt``, the pump that sends a run's events as updates, and the
permission question.

A prompt's path: its blocks become one text (refused blocks are ``-32602`` before the session
is looked up), the session's prompt slot is claimed, the trust dialog runs before the first
prompt of a session, the runtime admits the message and starts a run, the pump sends every
event of that run, and the answer (stop reason and this turn's usage) is queued only once
every update of the run is on the wire.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import trio

from maple_acp.edge._closing import CLOSE_DEADLINE_S
from maple_acp.edge._projection import Outbound, config_options
from maple_acp.edge._prompt import prompt_text
from maple_acp.edge._session import EdgeSession, SessionClosed
from maple_acp.rpc import ConnectionClosed, OutboundFrameTooLarge, request_arrival
from maple_acp.runtime import (
    CommandsChanged,
    ContextUsage,
    PermissionRequest,
    PlanUpdated,
    PromptClaim,
    Run,
    RunEnded,
    RunEvent,
    RunNotice,
    RunState,
    TextChunk,
    ThoughtChunk,
    TitleChanged,
    ToolRow,
    ToolState,
    ToolStatus,
)
from maple_acp.runtime import StopReason as RunStopReason
from maple_acp.runtime import Usage as RunUsage
from maple_acp.wire import (
    ChunkKind,
    PermissionOption,
    PromptRequest,
    PromptResponse,
    ProtocolError,
    RequestPermissionRequest,
    RequestPermissionResponse,
    SelectedPermissionOutcome,
    StopReason,
    Usage,
    structure_params,
    unstructure,
)

if TYPE_CHECKING:
    from maple_acp.edge._connection import AcpConnection

logger = logging.getLogger(__name__)

#: An answer no runtime responder accepts: handing it over fails the request closed (deny, and
#: cancel the run), which is the rule for every malformed or failed permission answer.
_FAIL_CLOSED: Final = "fail-closed"
#: Permission options: only these two exist (there is no "always").
PERMISSION_OPTIONS: Final = (
    PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
)
#: Our option ids, as the runtime's responder words them.
_ANSWERS: Final = {"allow_once": "allow_once", "reject_once": "deny_once"}

#: The update kind of each text event.
_CHUNK_KINDS: Final[dict[type, ChunkKind]] = {
    TextChunk: "agent_message_chunk",
    ThoughtChunk: "agent_thought_chunk",
}
#: ACP's stop reason for a completed turn, by the backend's own (``Turn.stop_reason``).
_COMPLETED_REASONS: Final[dict[RunStopReason, StopReason]] = {
    RunStopReason.END_TURN: "end_turn",
    RunStopReason.MAX_TOKENS: "max_tokens",
    RunStopReason.MAX_TURN_REQUESTS: "max_turn_requests",
    RunStopReason.REFUSAL: "refusal",
}


def prompt_answer(
    state: RunState,
    usage: RunUsage | None = None,
    reason: RunStopReason = RunStopReason.END_TURN,
) -> PromptResponse:
    """A prompt's answer: its stop reason and exactly this turn's usage (zero for a turn that
    was cancelled before its run began). A completed turn answers the backend's reason; a
    failed one ``end_turn``: its failure text was already shown as agent text, and answering
    normally keeps a client from retrying work that may have had effects."""
    usage = usage or RunUsage()
    if state is RunState.CANCELLED:
        stop: StopReason = "cancelled"
    elif state is RunState.COMPLETED:
        stop = _COMPLETED_REASONS[reason]
    else:
        stop = "end_turn"
    return PromptResponse(
        stop_reason=stop,
        usage=Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total_tokens,
            cached_read_tokens=usage.cache_read_tokens,
            cached_write_tokens=usage.cache_write_tokens,
        ),
    )


class PromptTurns:
    """Every prompt turn of one connection, and the pump every run's events go through."""

    def __init__(self, connection: AcpConnection) -> None:
        self.connection = connection

    async def prompt(self, request: PromptRequest) -> PromptResponse:
        # The blocks first: a refused block is bad params whatever the session.
        text = prompt_text(request.prompt)
        session = self.connection.session(request.session_id)
        # The runtime's prompt slot: RUN_ACTIVE (-32600) while another prompt holds it.
        with session.lease.claim_prompt() as claim:
            try:
                with session.update_scope():
                    return await self._turn(session, claim, text, request_arrival())
            except SessionClosed:
                return prompt_answer(RunState.CANCELLED)
            # A closed session's pump is cancelled from outside; the turn ends cancelled.
            return prompt_answer(RunState.CANCELLED)

    async def _turn(
        self, session: EdgeSession, claim: PromptClaim, text: str, arrival: int
    ) -> PromptResponse:
        lease = session.lease
        with session.abortable() as before_run:
            if session.cancelled_since(arrival):
                before_run.cancel()
            # Before the first prompt of each session, new or loaded: a skill may have been
            # added to the project since the task was last used.
            if not session.trust_settled and not await self.connection.trust.settle(session):
                # Cancel admits no user message and saves nothing.
                return prompt_answer(RunState.CANCELLED)
            session.trust_settled = True
        if before_run.cancelled_caught or session.cancelled_since(arrival):
            return prompt_answer(RunState.CANCELLED)
        was_locked = session.model_locked
        run = await lease.start_run(text, claim=claim)
        if session.cancelled_since(arrival):
            # A cancel or close arrived while the run was being admitted; it found no run.
            run.cancel()
        try:
            if not was_locked:
                options = config_options(session.choices, session.current_model, locked=True)
                await self.connection.send(session.projector.config_update(options))
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
        await self.connection.peer.drain()
        return prompt_answer(state, outcome.usage, outcome.stop_reason)

    async def pump(self, session: EdgeSession, run: Run) -> RunState:
        """Send every event of ``run`` as it comes; return the run's final state.

        Events arrive in batches (everything queued at that moment). The text chunks of a
        batch become finished lines handed to the peer together, one hand-off per run of
        chunks; any other event first sends the lines before it, so the order holds."""
        projector = session.projector
        text_line = projector.text_line
        dropped = False
        async with trio.open_nursery() as permissions:
            try:
                async for batch in run.event_batches():
                    lines: list[bytes] = []
                    for event in batch:
                        kind = _CHUNK_KINDS.get(type(event))
                        if kind is not None:
                            chunk: TextChunk | ThoughtChunk = event  # type: ignore[assignment]
                            line = text_line(kind, chunk.message_id, chunk.text)
                            if line is not None:
                                lines.append(line)
                            else:
                                lines.extend(projector.text(kind, chunk.message_id, chunk.text))
                            continue
                        if lines:
                            dropped |= await self._send_lines(session, run, lines)
                            lines = []
                        if isinstance(event, RunEnded):
                            # A turn that lost an update did not end normally, even if its
                            # run completed before the cancel reached it.
                            return RunState.CANCELLED if dropped else event.outcome.state
                        if isinstance(event, PermissionRequest):
                            permissions.start_soon(self._ask_permission, session, event)
                        else:
                            dropped |= await self._send_event(session, run, event)
                    if lines:
                        dropped |= await self._send_lines(session, run, lines)
            finally:
                permissions.cancel_scope.cancel()
        outcome = await run.wait()
        return outcome.state

    async def _send_lines(self, session: EdgeSession, run: Run, lines: list[bytes]) -> bool:
        """Hand finished text lines to the peer; True if one was too large (turn ended)."""
        try:
            await self.connection.peer.notify_lines(lines)
        except OutboundFrameTooLarge as exc:
            await self._oversize(session, run, exc)
            return True
        return False

    async def _send_event(self, session: EdgeSession, run: Run, event: RunEvent) -> bool:
        """Send the update of one event other than text; True if it was too large."""
        projector = session.projector
        update: Outbound | None = None
        if isinstance(event, ToolRow):
            update = projector.tool(event.tool_id, event.tool)
        elif isinstance(event, TitleChanged):
            update = projector.title(event.title)
        elif isinstance(event, PlanUpdated):
            update = projector.plan(event.entries)
        elif isinstance(event, ContextUsage):
            update = projector.context_usage(event.used, event.size)
        elif isinstance(event, CommandsChanged):
            update = projector.commands(event.commands)
        try:
            if isinstance(event, RunNotice):
                await self.connection.send_many(
                    projector.notice(f"{event.run_id}-notice", event.text)
                )
            elif update is not None:
                await self.connection.send(update)
        except OutboundFrameTooLarge as exc:
            await self._oversize(session, run, exc)
            return True
        return False

    async def _oversize(self, session: EdgeSession, run: Run, exc: Exception) -> None:
        # One oversized update ends the turn, not the connection.
        logger.warning("ending a turn: %s", exc)
        run.cancel()
        await self.connection.send_many(
            session.projector.notice(
                f"{run.id}-oversize", "An update was too large to send; the turn was ended."
            )
        )

    async def _ask_permission(self, session: EdgeSession, event: PermissionRequest) -> None:
        """Ask the client; anything but a clean ``allow_once``/``reject_once`` fails closed."""
        request = event.request
        pending = ToolState(
            name=request.name,
            status=ToolStatus.PENDING,
            title=request.title,
            raw_input=request.raw_input,
        )
        params = RequestPermissionRequest(
            session_id=session.id,
            tool_call=session.projector.tool_call(request.tool_id, pending),
            options=PERMISSION_OPTIONS,
        )
        answer = _FAIL_CLOSED
        try:
            result = await self.connection.peer.request(
                "session/request_permission", unstructure(params), hold_credit=True
            )
            outcome = structure_params(result, RequestPermissionResponse).outcome
            if isinstance(outcome, SelectedPermissionOutcome):
                answer = _ANSWERS.get(outcome.option_id, _FAIL_CLOSED)
        except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
            logger.info("permission request failed closed: %s", getattr(exc, "message", exc))
        finally:
            # Cancellation (the run ended, the session closed) lands here too: the responder
            # then refuses the late answer and the run's own cancellation already denied it.
            event.responder.answer(answer)
