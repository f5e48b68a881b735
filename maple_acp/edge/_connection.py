"""One ACP connection: its lifetime, method dispatch and host status.

Concurrency shape: the connection owns one nursery. The JSON-RPC peer runs in it (reader,
writer, one task per inbound request), and so does every session lease
(``AgentService.serve_new_task`` / ``serve_task``), each with its own nursery inside the
runtime where its run and MCP router live. A prompt runs as its request's task, so the
connection keeps reading while it runs; ``session/cancel`` and ``$/cancel_request`` reach it.

Each flow lives in its own module and class, sharing this connection: opening sessions
(``_opening``), closing and deleting them (``_closing``), the prompt turn (``_turn``), the
trust dialog (``_trust``) and goals (``_goals``). Dispatch comes from ``wire.AGENT_METHODS``:
params are converted to the method's wire type once, here; a handler gets that typed request
and returns the method's typed response.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from maple_acp.edge._closing import SessionCloser
from maple_acp.edge._errors import protocol_error, unknown_session
from maple_acp.edge._goals import GoalFlow
from maple_acp.edge._opening import SessionOpener
from maple_acp.edge._projection import UPDATE_METHOD, Outbound, encode_update
from maple_acp.edge._session import EdgeSession
from maple_acp.edge._trust import TrustDialog
from maple_acp.edge._turn import PromptTurns
from maple_acp.mcp import ExternalMcpError
from maple_acp.rpc import JsonRpcPeer, method_not_found
from maple_acp.runtime import RelayValues, RuntimeRejection
from maple_acp.wire import (
    AGENT_METHODS,
    BRIDGE_HELLO_METHOD,
    GOAL_CONTROL_METHOD,
    INVALID_PARAMS,
    STATUS_METHOD,
    BridgeHello,
    CancelNotification,
    HostStatus,
    InitializeRequest,
    InitializeResponse,
    ProtocolError,
    StatusRequest,
    structure_params,
    unstructure,
)

if TYPE_CHECKING:
    from maple_acp.edge._service import AcpService

logger = logging.getLogger(__name__)

#: The bound for the asynchronous cleanup after a disconnect (SPEC.md).
DISCONNECT_CLEANUP_S: Final = 5.0
#: Updates handed to the peer at once by :meth:`AcpConnection.send_many`: half the outbound
#: line budget, so a batch never waits for credit it could never get in one go.
SEND_BATCH: Final = 128

Handler = Callable[[Any], Awaitable[Any]]


def _checked_session_id(request: Any) -> Any:
    """The shared input rule: a session id is trimmed, and a blank one is bad params."""
    session_id = request.session_id
    trimmed = session_id.strip()
    if not trimmed:
        raise ProtocolError(INVALID_PARAMS, "sessionId: must not be blank")
    return request if trimmed == session_id else attrs.evolve(request, session_id=trimmed)


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
        self.relay = RelayValues({})
        self.elicitation_form = False
        #: Set when the client finished sending: sessions opened after it are revoked at once.
        self.ended = False
        self._nursery: trio.Nursery | None = None
        self.opener = SessionOpener(self)
        self.closer = SessionCloser(self)
        self.trust = TrustDialog(self)
        self.turns = PromptTurns(self)
        self.goals = GoalFlow(self)
        handlers: dict[str, Handler] = {
            "initialize": self._initialize,
            "session/new": self.opener.new,
            "session/load": self.opener.load,
            "session/resume": self.opener.resume,
            "session/list": self.opener.list,
            "session/prompt": self.turns.prompt,
            "session/close": self.closer.close,
            "session/set_config_option": self.opener.set_config_option,
            "session/set_mode": self.opener.set_mode,
            GOAL_CONTROL_METHOD: self.goals.control,
            STATUS_METHOD: self._status,
        }
        if self.config.allow_session_delete:
            handlers["session/delete"] = self.closer.delete
        #: method -> (params type, handler, whether the params carry a session id)
        self._requests: dict[str, tuple[Any, Handler, bool]] = {
            method: (AGENT_METHODS[method].params, handler, _has_session_id(method))
            for method, handler in handlers.items()
        }

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "the connection is not running"
        return self._nursery

    # -- lifetime ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until the client disconnects or the service stops.

        Resource handling: on the way out every lease of the connection is revoked
        synchronously (runs cancelled, pending permissions denied, relay values and MCP routers
        dropped), then released with a :data:`DISCONNECT_CLEANUP_S` bound.
        """
        logger.info("ACP connection opened")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self.peer.serve()
                finally:
                    self.revoke_all()
                    nursery.cancel_scope.deadline = trio.current_time() + DISCONNECT_CLEANUP_S
                    await self.closer.release_all()
                    nursery.cancel_scope.cancel()
        finally:
            self.revoke_all()
            logger.info("ACP connection closed: %s", self.peer.close_reason or "ended")

    def _input_ended(self) -> None:
        """The client finished sending: that is a disconnect, so every capability goes now.
        Requests already read still get their answers (a cancelled prompt answers
        ``cancelled``) while the peer gives them a short grace."""
        self.ended = True
        self.revoke_all()

    @property
    def ending(self) -> bool:
        """The connection is ending (the client finished sending, or the transport ended):
        its sessions end with it, none of them revoked by the runtime."""
        return self.ended or self.peer.closed

    def revoke_all(self) -> None:
        for session in self.sessions.values():
            session.stop_updates()
            session.lease.revoke("the connection ended")

    async def aclose(self) -> None:
        await self.peer.aclose()

    # -- dispatch ----------------------------------------------------------------------------

    async def _on_request(self, method: str, params: Any) -> Any:
        entry = self._requests.get(method)
        if entry is None:
            raise method_not_found(method)
        params_type, handler, has_session = entry
        request = structure_params(params, params_type)
        if has_session:
            request = _checked_session_id(request)
        try:
            response = await handler(request)
        except (RuntimeRejection, ExternalMcpError) as exc:
            raise protocol_error(exc) from None
        return unstructure(response)

    async def _on_notification(self, method: str, params: Any) -> None:
        if method == "session/cancel":
            request = _checked_session_id(structure_params(params, CancelNotification))
            session = self.sessions.get(request.session_id)
            if session is not None:
                session.cancel_prompt(self.peer.frames_received)
        elif method == BRIDGE_HELLO_METHOD:
            self._hello(params)
        else:
            logger.debug("ignoring notification %r", method[:64])

    def _hello(self, params: Any) -> None:
        if self.peer.frames_received != 1:
            logger.warning("ignoring a bridge hello that was not the connection's first frame")
            return
        try:
            hello = structure_params(params, BridgeHello)
            # The runtime keeps the names this host allows and checks them, once.
            self.relay = self.runtime.accept_relay(hello.environment)
        except (ProtocolError, RuntimeRejection) as exc:
            logger.warning("ignoring a bridge hello: %s", getattr(exc, "message", exc))
            return
        logger.debug(
            "relay values accepted for %d names (%d not allowed)",
            len(self.relay),
            self.relay.dropped,
        )

    def session(self, session_id: str) -> EdgeSession:
        """This connection's live session ``session_id``, or ``-32002``."""
        session = self.sessions.get(session_id)
        if session is None or session.closing:
            raise unknown_session()
        return session

    async def send(self, update: Outbound) -> None:
        """Queue one ``session/update``: a typed notification, or a text chunk's line."""
        if type(update) is bytes:
            await self.peer.notify_encoded(update)
        else:
            await self.peer.notify(UPDATE_METHOD, unstructure(update))

    async def send_many(self, updates: Iterable[Outbound]) -> None:
        """Queue many updates in order, handed to the peer :data:`SEND_BATCH` lines at a time
        (a history replay: one hand-off per batch instead of one per line)."""
        batch: list[bytes] = []
        for update in updates:
            batch.append(update if isinstance(update, bytes) else encode_update(update))
            if len(batch) >= SEND_BATCH:
                await self.peer.notify_lines(batch)
                batch = []
        if batch:
            await self.peer.notify_lines(batch)

    # -- initialize and status ---------------------------------------------------------------

    async def _initialize(self, request: InitializeRequest) -> InitializeResponse:
        elicitation = request.client_capabilities.elicitation
        self.elicitation_form = elicitation is not None and elicitation.form is not None
        return self.service.initialize_response

    async def _status(self, request: StatusRequest) -> HostStatus:
        acp = self.service.status()
        runtime = self.runtime.status()
        return HostStatus(
            running=acp.running,
            endpoint=acp.endpoint,
            connections=acp.connections,
            sessions=acp.sessions,
            active_runs=runtime.active_runs,
            leases=runtime.leases,
            signed_in=runtime.account is not None,
        )

    @property
    def active_runs(self) -> int:
        return sum(1 for s in self.sessions.values() if s.lease.active_run is not None)


def _has_session_id(method: str) -> bool:
    params = AGENT_METHODS[method].params
    return isinstance(params, type) and any(a.name == "session_id" for a in attrs.fields(params))
