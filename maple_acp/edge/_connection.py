"""One ACP connection: method dispatch, session leases, the prompt pump, close and disconnect.

Concurrency shape: the connection owns one nursery. The JSON-RPC peer runs in it (reader,
writer, one task per inbound request), and so does every session lease
(``AgentService.serve_new_task`` / ``serve_task``), each with its own nursery inside the
runtime where its run and MCP router live. A prompt runs as its request's task, so the
connection keeps reading while it runs; ``session/cancel`` and ``$/cancel_request`` reach it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import trio

from maple_acp.edge._errors import protocol_error, unknown_session
from maple_acp.edge._projection import (
    MODE_ID,
    MODE_OPTION_ID,
    MODEL_OPTION_ID,
    config_options,
    mode_state,
)
from maple_acp.edge._prompt import mcp_definitions, prompt_text
from maple_acp.edge._session import EdgeSession, SessionClosed
from maple_acp.mcp import (
    ExternalMcpError,
    McpRouter,
    ValidatedServer,
    validate_servers,
)
from maple_acp.rpc import (
    ConnectionClosed,
    JsonRpcPeer,
    OutboundFrameTooLarge,
    method_not_found,
    request_arrival,
)
from maple_acp.runtime import (
    CycleStarted,
    GoalChanged,
    LeaseRevoked,
    PermissionRequest,
    RejectionKind,
    Run,
    RunEnded,
    RunNotice,
    RunState,
    RuntimeRejection,
    SessionLease,
    TextChunk,
    ThoughtChunk,
    TitleChanged,
    ToolRow,
    ToolState,
    ToolStatus,
    Usage,
    canonical_directory,
    validate_relay_values,
)
from maple_acp.wire import (
    GOAL_CONTROL_METHOD,
    INVALID_PARAMS,
    INVALID_REQUEST,
    AgentCapabilities,
    BridgeHello,
    CancelNotification,
    CloseSessionRequest,
    CreateElicitationResponse,
    ElicitationAccept,
    ElicitationDecline,
    GoalCapability,
    GoalControlRequest,
    Implementation,
    InitializeRequest,
    InitializeResponse,
    ListSessionsRequest,
    LoadSessionRequest,
    McpCapabilities,
    NewSessionRequest,
    PromptCapabilities,
    PromptRequest,
    ProtocolError,
    RequestPermissionResponse,
    SelectedPermissionOutcome,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionListCapabilities,
    SetSessionConfigOptionRequest,
    SetSessionModeRequest,
    goal_capability_meta,
    structure_params,
    unstructure,
)

if TYPE_CHECKING:
    from maple_acp.edge._service import AcpService

logger = logging.getLogger(__name__)

#: One deadline for cancel + operation barrier + lease cleanup on close (SPEC.md).
CLOSE_DEADLINE_S: Final = 5.0
#: The same bound for the asynchronous cleanup after a disconnect.
DISCONNECT_CLEANUP_S: Final = 5.0
#: The only protocol version this agent speaks; any requested version is answered with it.
PROTOCOL_VERSION: Final = 1
#: The goal actions the runtime implements; only these are advertised and accepted.
GOAL_ACTIONS: Final = ("set", "pause", "resume", "clear")
#: Host status for ``maple-acp status`` (same trust boundary as every other method).
STATUS_METHOD: Final = "_maple/status"
#: The notification a connector may send first with relay values.
BRIDGE_HELLO: Final = "_maple/bridge/hello"
#: An answer no runtime responder accepts: handing it over fails the request closed (deny, and
#: cancel the run), which is the rule for every malformed or failed permission answer.
_FAIL_CLOSED: Final = "fail-closed"
#: Permission options: only these two exist (there is no "always").
_PERMISSION_OPTIONS: Final = [
    {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
]
_TRUST_KEEP: Final = "keep_disabled"
_TRUST_YES: Final = "trust"
_TRUST_CANCEL: Final = "cancel_turn"
#: The trust chooser's options, in this order: two allow-kind choices so a client's generic
#: auto-accept cannot decide trust silently, and one reject-kind choice that cancels the turn.
_TRUST_OPTIONS: Final = [
    {"optionId": _TRUST_KEEP, "name": "Keep project trust disabled", "kind": "allow_once"},
    {"optionId": _TRUST_YES, "name": "Trust this project", "kind": "allow_once"},
    {"optionId": _TRUST_CANCEL, "name": "Cancel turn", "kind": "reject_once"},
]
_TRUST_FIELD: Final = "trustProject"

_STOP_REASONS: Final = {
    RunState.COMPLETED: "end_turn",
    RunState.CANCELLED: "cancelled",
    # The failure text was already shown as agent text; answering the turn normally keeps a
    # client from retrying work that may have had effects.
    RunState.FAILED: "end_turn",
}

Handler = Callable[[Any], Awaitable[Any]]


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "totalTokens": usage.total_tokens,
        "cachedReadTokens": usage.cache_read_tokens,
        "cachedWriteTokens": usage.cache_write_tokens,
    }


def _prompt_answer(state: RunState, usage: Usage | None = None) -> dict[str, Any]:
    """A prompt's answer: its stop reason and exactly this turn's usage (zero for a turn that
    was cancelled before its run began)."""
    return {"stopReason": _STOP_REASONS[state], "usage": _usage(usage or Usage())}


def _iso8601(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


class AcpConnection:
    """See the module docstring. Built and run by :class:`~maple_acp.edge.AcpService`."""

    def __init__(self, service: AcpService, stream: trio.abc.Stream) -> None:
        self.service = service
        self.runtime = service.runtime
        self.config = service.config
        self.peer = JsonRpcPeer(
            stream,
            on_request=self._on_request,
            on_notification=self._on_notification,
            max_line_bytes=self.config.max_line_bytes,
            max_outbound_lines=self.config.max_outbound_lines,
            max_outbound_bytes=self.config.max_outbound_bytes,
            on_eof=self._input_ended,
        )
        self.sessions: dict[str, EdgeSession] = {}
        #: Sessions whose close missed the deadline: a late load must not republish them.
        self.tombstones: set[str] = set()
        self.relay: dict[str, str] = {}
        self.elicitation_form = False
        self._nursery: trio.Nursery | None = None
        self._ended = False
        self._requests: dict[str, Handler] = {
            "initialize": self._initialize,
            "session/new": self._new,
            "session/load": self._load,
            "session/list": self._list,
            "session/prompt": self._prompt,
            "session/close": self._close,
            "session/set_config_option": self._set_config_option,
            "session/set_mode": self._set_mode,
            GOAL_CONTROL_METHOD: self._goal,
            STATUS_METHOD: self._status,
        }

    # -- lifetime ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until the client disconnects or the service stops.

        Resource handling: on the way out every lease of the connection is revoked
        synchronously (runs cancelled, pending permissions denied, relay values and MCP routers
        dropped), then released with a :data:`DISCONNECT_CLEANUP_S` bound.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self.peer.serve()
                finally:
                    self._revoke_all()
                    nursery.cancel_scope.deadline = trio.current_time() + DISCONNECT_CLEANUP_S
                    await self._release_all()
                    nursery.cancel_scope.cancel()
        finally:
            self._revoke_all()

    def _input_ended(self) -> None:
        """The client finished sending: that is a disconnect, so every capability goes now.
        Requests already read still get their answers (a cancelled prompt answers
        ``cancelled``) while the peer gives them a short grace."""
        self._ended = True
        self._revoke_all()

    def _revoke_all(self) -> None:
        for session in self.sessions.values():
            session.stop_updates()
            session.lease.revoke("the connection ended")

    async def _release_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for session in list(self.sessions.values()):
                nursery.start_soon(partial(session.lease.release, close=False))
        self.sessions.clear()

    async def aclose(self) -> None:
        await self.peer.aclose()

    # -- dispatch ----------------------------------------------------------------------------

    async def _on_request(self, method: str, params: Any) -> Any:
        handler = self._requests.get(method)
        if handler is None:
            raise method_not_found(method)
        try:
            return await handler(params)
        except (RuntimeRejection, ExternalMcpError) as exc:
            raise protocol_error(exc) from None

    async def _on_notification(self, method: str, params: Any) -> None:
        if method == "session/cancel":
            request = structure_params(params, CancelNotification)
            session = self.sessions.get(request.session_id)
            if session is not None:
                session.cancel_prompt(self.peer.frames_received)
        elif method == BRIDGE_HELLO:
            self._hello(params)
        else:
            logger.debug("ignoring notification %r", method[:64])

    def _hello(self, params: Any) -> None:
        if self.peer.frames_received != 1:
            logger.warning("ignoring a bridge hello that was not the connection's first frame")
            return
        allowed = self.runtime.relay_allow_list
        try:
            hello = structure_params(params, BridgeHello)
            # A connector may offer more than this host allows: keep only allowed names.
            offered = {k: v for k, v in hello.environment.items() if k in allowed}
            self.relay = validate_relay_values(offered, allowed)
        except (ProtocolError, RuntimeRejection) as exc:
            logger.warning("ignoring a bridge hello: %s", getattr(exc, "message", exc))
            return
        dropped = len(hello.environment) - len(offered)
        logger.debug(
            "relay values accepted for %d names (%d not allowed)", len(self.relay), dropped
        )

    def _session(self, session_id: str) -> EdgeSession:
        session = self.sessions.get(session_id)
        if session is None or session.closing:
            raise unknown_session()
        return session

    async def _update(self, params: dict[str, Any]) -> None:
        await self.peer.notify("session/update", params)

    # -- initialize --------------------------------------------------------------------------

    async def _initialize(self, params: Any) -> Any:
        request = structure_params(params, InitializeRequest)
        elicitation = request.client_capabilities.elicitation
        self.elicitation_form = elicitation is not None and elicitation.form is not None
        return self.service.initialize_result()

    # -- sessions ----------------------------------------------------------------------------

    async def _admit_cwd(self, cwd: str, additional: tuple[str, ...]) -> str:
        if additional:
            raise ProtocolError(INVALID_PARAMS, "additionalDirectories is not supported")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise ProtocolError(INVALID_PARAMS, "cwd: expected an absolute path")
        root = await canonical_directory(cwd)
        if not self.config.admits(root):
            raise ProtocolError(INVALID_PARAMS, "cwd is outside the allowed project roots")
        return root

    def _router_factory(
        self, servers: tuple[ValidatedServer, ...]
    ) -> Callable[[trio.Nursery], Awaitable[McpRouter]] | None:
        if not servers:
            return None

        async def start(nursery: trio.Nursery) -> McpRouter:
            router = McpRouter(servers)
            await nursery.start(router.serve)
            return router

        return start

    async def _open_session(self, start: Callable[..., Awaitable[None]]) -> EdgeSession:
        assert self._nursery is not None
        lease: SessionLease = await self._nursery.start(start)
        # Registered before any other checkpoint, so a disconnect from here on revokes it.
        session = EdgeSession(lease, self.runtime.cached_model_choices())
        self.sessions[session.id] = session
        if self._ended:
            # Set up after the client finished sending: revoked like every other session.
            self._revoke_all()
            raise unknown_session()
        self._nursery.start_soon(self._pump_session_events, session)
        # The catalog listing is cached by the runtime (one bounded discovery, then warm).
        session.choices = await lease.model_choices()
        return session

    def _session_result(self, session: EdgeSession) -> dict[str, Any]:
        return {
            "modes": unstructure(mode_state()),
            "configOptions": config_options(
                session.choices, session.current_model, locked=session.model_locked
            ),
        }

    async def _new(self, params: Any) -> Any:
        request = structure_params(params, NewSessionRequest)
        servers = validate_servers(mcp_definitions(request.mcp_servers))
        root = await self._admit_cwd(request.cwd, request.additional_directories)
        session = await self._open_session(
            partial(
                self.runtime.serve_new_task,
                root,
                relay=self.relay,
                router_factory=self._router_factory(servers),
            )
        )
        return {"sessionId": session.id, **self._session_result(session)}

    async def _load(self, params: Any) -> Any:
        request = structure_params(params, LoadSessionRequest)
        if request.session_id in self.tombstones:
            raise ProtocolError(INVALID_REQUEST, "the session is closing")
        if request.session_id in self.sessions:
            raise ProtocolError(INVALID_REQUEST, "the session is already loaded on this connection")
        servers = validate_servers(mcp_definitions(request.mcp_servers))
        root = await self._admit_cwd(request.cwd, request.additional_directories)
        session = await self._open_session(
            partial(
                self.runtime.serve_task,
                request.session_id,
                root,
                relay=self.relay,
                router_factory=self._router_factory(servers),
            )
        )
        # Replay the visible history before answering, through the live projector.
        with session.operation(), session.update_scope():
            for update in session.projector.history(await session.lease.history()):
                await self._update(update)
            goal = session.lease.goal
            if goal is not None:
                await self._update(session.projector.goal(goal))
        if session.stopped:
            raise unknown_session()
        return self._session_result(session)

    async def _list(self, params: Any) -> Any:
        request = structure_params(params, ListSessionsRequest)
        cwd = None
        if request.cwd is not None:
            cwd = await self._admit_cwd(request.cwd, ())
        listing = await self.runtime.list_tasks(cwd=cwd, cursor=request.cursor)
        sessions = []
        for task in listing.tasks:
            if not self.config.admits(task.root):
                continue
            info: dict[str, Any] = {
                "sessionId": task.id,
                "cwd": task.root,
                "updatedAt": _iso8601(task.updated_ms),
            }
            if task.title:
                info["title"] = task.title
            sessions.append(info)
        result: dict[str, Any] = {"sessions": sessions}
        if listing.next_cursor is not None:
            result["nextCursor"] = listing.next_cursor
        return result

    async def _set_mode(self, params: Any) -> Any:
        request = structure_params(params, SetSessionModeRequest)
        self._session(request.session_id)
        if request.mode_id != MODE_ID:
            raise ProtocolError(INVALID_PARAMS, f"modeId: the only mode is {MODE_ID!r}")
        return {}

    async def _set_config_option(self, params: Any) -> Any:
        request = structure_params(params, SetSessionConfigOptionRequest)
        session = self._session(request.session_id)
        value = request.value
        if request.config_id == MODEL_OPTION_ID:
            if not isinstance(value, str):
                raise ProtocolError(INVALID_PARAMS, "value: expected a model id")
            with session.operation():
                await session.lease.set_model(value)
        elif request.config_id == MODE_OPTION_ID:
            if value != MODE_ID:
                raise ProtocolError(INVALID_PARAMS, f"value: the only mode is {MODE_ID!r}")
        else:
            raise ProtocolError(INVALID_PARAMS, "configId: unknown config option")
        return {
            "configOptions": config_options(
                session.choices, session.current_model, locked=session.model_locked
            )
        }

    # -- goals -------------------------------------------------------------------------------

    async def _goal(self, params: Any) -> Any:
        request = structure_params(params, GoalControlRequest)
        session = self.sessions.get(request.session_id)
        if session is None or session.closing:
            raise ProtocolError(INVALID_PARAMS, "sessionId: unknown session")
        if request.action not in GOAL_ACTIONS:
            raise ProtocolError(INVALID_PARAMS, "action: not supported")
        lease = session.lease
        with session.operation():
            try:
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
            except RuntimeRejection as exc:
                if exc.kind is RejectionKind.INVALID_GOAL:
                    raise ProtocolError(INVALID_PARAMS, exc.message) from None
                raise
        return {}

    async def _pump_session_events(self, session: EdgeSession) -> None:
        """Forward what happens outside any prompt: goal snapshots and autonomous cycles.

        A cycle's run is pumped in a task of its own, so that a long cycle never holds back
        the goal snapshots (a pause, a clear) published while it runs."""
        events = session.lease.session_events()
        try:
            with session.update_scope():
                async with trio.open_nursery() as cycles:
                    async for event in events:
                        if isinstance(event, GoalChanged):
                            await self._update(session.projector.goal(event.goal))
                        elif isinstance(event, CycleStarted):
                            cycles.start_soon(self._pump_cycle, session, event.run)
                        elif isinstance(event, LeaseRevoked):
                            break
                    cycles.cancel_scope.cancel()
        except (SessionClosed, ConnectionClosed):
            return
        self._forget(session)

    async def _pump_cycle(self, session: EdgeSession, run: Run) -> None:
        try:
            await self._pump_run(session, run)
        except ConnectionClosed:
            run.cancel()

    def _forget(self, session: EdgeSession) -> None:
        """The runtime revoked the lease on its own (sign-out, account change, drain): the
        session is gone for this connection; its cleanup goes on in the background."""
        if session.closing or self.sessions.get(session.id) is not session:
            return
        logger.info("session %s was revoked by the runtime", session.id)
        session.stop_updates()
        del self.sessions[session.id]
        assert self._nursery is not None
        self._nursery.start_soon(partial(session.lease.release, close=False))

    # -- prompt ------------------------------------------------------------------------------

    async def _prompt(self, params: Any) -> Any:
        request = structure_params(params, PromptRequest)
        session = self._session(request.session_id)
        text = prompt_text(request.prompt)
        if not session.begin_prompt():
            raise ProtocolError(INVALID_REQUEST, "a prompt is already running in this session")
        try:
            with session.operation():
                try:
                    with session.update_scope():
                        return await self._run_prompt(session, text, request_arrival())
                except SessionClosed:
                    return _prompt_answer(RunState.CANCELLED)
                # A closed session's pump is cancelled from outside; the turn ends cancelled.
                return _prompt_answer(RunState.CANCELLED)
        finally:
            session.end_prompt()

    async def _run_prompt(self, session: EdgeSession, text: str, arrival: int) -> Any:
        lease = session.lease
        with session.abortable() as before_run:
            if session.cancelled_since(arrival):
                before_run.cancel()
            # Before the first prompt of each session, new or loaded: a skill may have been
            # added to the project since the task was last used.
            if not session.trust_settled:
                status = await lease.trust_status()
                if status.decision_needed:
                    decision = await self._ask_trust(session)
                    if decision is None:
                        # Cancel admits no user message and saves nothing.
                        return _prompt_answer(RunState.CANCELLED)
                    await lease.decide_trust(decision)
            session.trust_settled = True
        if before_run.cancelled_caught or session.cancelled_since(arrival):
            return _prompt_answer(RunState.CANCELLED)
        was_locked = session.model_locked
        run = await lease.start_run(text)
        if session.cancelled_since(arrival):
            # A cancel or close arrived while the run was being admitted; it found no run.
            run.cancel()
        try:
            if not was_locked:
                options = config_options(session.choices, session.current_model, locked=True)
                await self._update(session.projector.config_update(options))
            state = await self._pump_run(session, run)
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
        await self.peer.drain()
        return _prompt_answer(state, outcome.usage)

    async def _pump_run(self, session: EdgeSession, run: Run) -> RunState:
        """Send every event of ``run`` as it comes; return the run's final state."""
        projector = session.projector
        dropped = False
        async with trio.open_nursery() as permissions:
            try:
                async for event in run.events():
                    try:
                        if isinstance(event, TextChunk):
                            for params in projector.text(
                                "agent_message_chunk", event.message_id, event.text
                            ):
                                await self._update(params)
                        elif isinstance(event, ThoughtChunk):
                            for params in projector.text(
                                "agent_thought_chunk", event.message_id, event.text
                            ):
                                await self._update(params)
                        elif isinstance(event, ToolRow):
                            await self._update(projector.tool(event.tool_id, event.tool))
                        elif isinstance(event, PermissionRequest):
                            permissions.start_soon(self._ask_permission, session, event)
                        elif isinstance(event, TitleChanged):
                            await self._update(projector.title(event.title))
                        elif isinstance(event, RunNotice):
                            for params in projector.notice(f"{event.run_id}-notice", event.text):
                                await self._update(params)
                        elif isinstance(event, RunEnded):
                            # A turn that lost an update did not end normally, even if its
                            # run completed before the cancel reached it.
                            return RunState.CANCELLED if dropped else event.outcome.state
                    except OutboundFrameTooLarge as exc:
                        # One oversized update ends the turn, not the connection.
                        logger.warning("ending a turn: %s", exc)
                        dropped = True
                        run.cancel()
                        for params in projector.notice(
                            f"{run.id}-oversize",
                            "An update was too large to send; the turn was ended.",
                        ):
                            await self._update(params)
            finally:
                permissions.cancel_scope.cancel()
        outcome = await run.wait()
        return outcome.state

    async def _ask_permission(self, session: EdgeSession, event: PermissionRequest) -> None:
        """Ask the client; anything but a clean ``allow_once``/``reject_once`` fails closed."""
        request = event.request
        tool_call: dict[str, Any] = session.projector.tool(
            request.tool_id,
            _pending_tool(request.name, request.title, request.raw_input),
            announce=False,
        )["update"]
        tool_call.pop("sessionUpdate", None)
        params = {"sessionId": session.id, "toolCall": tool_call, "options": _PERMISSION_OPTIONS}
        answer = _FAIL_CLOSED
        try:
            result = await self.peer.request("session/request_permission", params, hold_credit=True)
            response = structure_params(result, RequestPermissionResponse)
            outcome = response.outcome
            if isinstance(outcome, SelectedPermissionOutcome):
                if outcome.option_id == "allow_once":
                    answer = "allow_once"
                elif outcome.option_id == "reject_once":
                    answer = "deny_once"
        except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
            logger.info("permission request failed closed: %s", getattr(exc, "message", exc))
        finally:
            # Cancellation (the run ended, the session closed) lands here too: the responder
            # then refuses the late answer and the run's own cancellation already denied it.
            event.responder.answer(answer)

    # -- project trust -----------------------------------------------------------------------

    async def _ask_trust(self, session: EdgeSession) -> bool | None:
        """The trust decision: True/False, or None to cancel the turn."""
        if self.elicitation_form:
            try:
                return await self._elicit_trust(session)
            except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
                logger.info("trust elicitation failed, asking with a chooser: %s", exc)
        return await self._choose_trust(session)

    async def _elicit_trust(self, session: EdgeSession) -> bool | None:
        params = {
            "sessionId": session.id,
            "mode": "form",
            "message": (
                "This project contains agent skills (.agents/skills). Trust this project so "
                "that its skills are visible to the model?"
            ),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    _TRUST_FIELD: {
                        "type": "boolean",
                        "title": "Trust this project",
                        "default": False,
                    }
                },
                "required": [_TRUST_FIELD],
            },
        }
        result = await self.peer.request("elicitation/create", params, hold_credit=True)
        response = structure_params(result, CreateElicitationResponse)
        if isinstance(response, ElicitationAccept):
            value = (response.content or {}).get(_TRUST_FIELD)
            if not isinstance(value, bool):
                raise ProtocolError(INVALID_PARAMS, "the trust answer is not a boolean")
            return value
        if isinstance(response, ElicitationDecline):
            return False
        return None

    async def _choose_trust(self, session: EdgeSession) -> bool | None:
        params = {
            "sessionId": session.id,
            "toolCall": {
                "toolCallId": f"project-trust-{session.id}",
                "title": "Trust this project? It contains agent skills (.agents/skills).",
                "kind": "other",
                "status": "pending",
            },
            "options": _TRUST_OPTIONS,
        }
        try:
            result = await self.peer.request("session/request_permission", params, hold_credit=True)
            response = structure_params(result, RequestPermissionResponse)
        except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
            logger.info("trust chooser failed; cancelling the turn: %s", exc)
            return None
        outcome = response.outcome
        if isinstance(outcome, SelectedPermissionOutcome):
            if outcome.option_id == _TRUST_KEEP:
                return False
            if outcome.option_id == _TRUST_YES:
                return True
        return None

    # -- close -------------------------------------------------------------------------------

    async def _close(self, params: Any) -> Any:
        request = structure_params(params, CloseSessionRequest)
        session = self._session(request.session_id)
        session.begin_close()
        deadline = trio.current_time() + CLOSE_DEADLINE_S
        finished = False
        with trio.move_on_at(deadline):
            session.lease.cancel_run()
            await session.wait_idle()
            await session.lease.release(close=True)
            finished = True
        # Nothing for this session may follow the close answer.
        session.stop_updates()
        del self.sessions[session.id]
        if not finished:
            logger.warning("close of session %s missed its deadline; revoking", session.id)
            session.lease.revoke("the close deadline passed")
            self.tombstones.add(session.id)
            # release() asks the lease's task to clean up; it goes on without us.
            assert self._nursery is not None
            self._nursery.start_soon(partial(session.lease.release, close=True))
        return {}

    # -- status ------------------------------------------------------------------------------

    async def _status(self, params: Any) -> Any:
        acp = self.service.status()
        runtime = self.runtime.status()
        return {
            "running": acp.running,
            "endpoint": acp.endpoint,
            "connections": acp.connections,
            "sessions": acp.sessions,
            "activeRuns": runtime.active_runs,
            "leases": runtime.leases,
            "signedIn": runtime.account is not None,
        }

    @property
    def active_runs(self) -> int:
        return sum(1 for s in self.sessions.values() if s.lease.active_run is not None)


def _pending_tool(name: str, title: str, raw_input: Any) -> ToolState:
    return ToolState(name=name, status=ToolStatus.PENDING, title=title, raw_input=raw_input)


def initialize_result(agent_name: str, agent_title: str, version: str) -> dict[str, Any]:
    """The initialize answer: version 1 and exactly what this agent supports."""
    response = InitializeResponse(
        protocol_version=PROTOCOL_VERSION,
        agent_capabilities=AgentCapabilities(
            load_session=True,
            prompt_capabilities=PromptCapabilities(
                image=False, audio=False, embedded_context=False
            ),
            mcp_capabilities=McpCapabilities(http=True, sse=False),
            session_capabilities=SessionCapabilities(
                list=SessionListCapabilities(), close=SessionCloseCapabilities()
            ),
        ),
        auth_methods=(),
        agent_info=Implementation(name=agent_name, title=agent_title, version=version),
        meta=goal_capability_meta(GoalCapability(actions=GOAL_ACTIONS)),
    )
    result: dict[str, Any] = unstructure(response)
    return result
