"""One ACP connection: its lifetime, method dispatch and host status.

Concurrency shape: the connection owns one nursery. The JSON-RPC peer runs in it (reader,
writer, one task per inbound request), and so does every session lease
(``AgentService.serve_new_task`` / ``serve_task``), each with its own nursery inside the
runtime where its run and MCP router live. A prompt runs as its request's task, so the
connection keeps reading while it runs; ``session/cancel`` and ``$/cancel_request`` reach it.
Requests are still *decided* in arrival order: the peer orders them by :func:`order_key`
(``initialize`` against all, a session's requests against each other), each flow says when
its request has decided (``rpc.admitted``), and a cancel acts once the requests before it
about its session have decided.

Each flow lives in its own module and class and gets only what it uses: the connection's
:class:`~maple_acp.edge._sessions.SessionTable` (the one owner of its sessions), its
:class:`~maple_acp.edge._client.ClientChannel` (everything sent to the client), the runtime,
the config, and small callables. Opening sessions (``_opening``), closing and deleting them
(``_closing``), the prompt turn (``_turn``), the trust dialog (``_trust``) and goals
(``_goals``). Dispatch comes from the dialect chosen at ``initialize`` (``_v1``, or ``_v2``
when the client asks for 2 and the host allows it; one version for the connection's life): its
method table names each method's params type and the operation that serves it; params are
converted to that type once, here; a handler gets that typed request and returns the
dialect's answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import trio

from maple_acp._text import one_line
from maple_acp.edge._background import BackgroundFlow
from maple_acp.edge._children import cancel_child
from maple_acp.edge._client import ClientChannel
from maple_acp.edge._closing import SessionCloser
from maple_acp.edge._config import AcpServiceConfig
from maple_acp.edge._dialect import Dialect, InitializeParams
from maple_acp.edge._errors import protocol_error
from maple_acp.edge._forking import SessionForker
from maple_acp.edge._goals import GoalFlow
from maple_acp.edge._notifications import MalformedNotifications
from maple_acp.edge._observing import SessionFollowing
from maple_acp.edge._opening import SessionOpener
from maple_acp.edge._queue import QueueFlow
from maple_acp.edge._sessions import SessionTable
from maple_acp.edge._steering import SteeringFlow
from maple_acp.edge._trust import TrustDialog
from maple_acp.edge._turn import PromptTurns
from maple_acp.edge._v1 import V1
from maple_acp.edge._v2 import V2
from maple_acp.mcp import ExternalMcpError
from maple_acp.rpc import EVERYTHING, JsonRpcPeer, MessageTransport, Params, method_not_found
from maple_acp.runtime import AgentService, RejectionKind, RelayValues, RuntimeRejection
from maple_acp.wire import (
    BRIDGE_HELLO_METHOD,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    BridgeHello,
    CancelNotification,
    HostStatus,
    InitializeResponse,
    ProtocolError,
    StatusRequest,
    structure_params,
    unstructure,
)

logger = logging.getLogger(__name__)

#: A method name or session id in a DEBUG line, at most (both come from the client).
MAX_LOGGED_ID_CHARS = 100
#: A client's name as another client's error quotes it: a product name, not a paragraph.
MAX_CLIENT_NAME_CHARS = 64

#: The bound for the asynchronous cleanup after a disconnect (the five-second rule,
#: docs/protocol.md).
DISCONNECT_CLEANUP_S: Final = 5.0
#: The protocol versions this agent speaks, oldest first; ``initialize`` picks one.
DIALECTS: Final[tuple[Dialect, ...]] = (V1, V2)

Handler = Callable[[Any], Awaitable[Any]]


def choose_dialect(requested: object, maximum: int) -> Dialect:
    """The newest dialect not newer than the client asked for nor than the host allows
    (else the oldest: any other request, even a malformed one, is answered with version 1)."""
    chosen = DIALECTS[0]
    if type(requested) is not int:
        return chosen
    for dialect in DIALECTS:
        if dialect.version <= min(requested, maximum):
            chosen = dialect
    return chosen


def session_key(session_id: str) -> tuple[str, str]:
    """The admission-order key of requests about one session."""
    return ("session", session_id.strip())


def order_key(method: str, params: Params) -> object:
    """A request's admission-order key (read from the raw params, before any check):
    ``initialize`` decides for the whole connection; a request naming a session is ordered
    against the others naming it; any other decides nothing another request depends on."""
    if method == "initialize":
        return EVERYTHING
    if type(params) is dict:
        session_id = params.get("sessionId")
        if type(session_id) is str:
            return session_key(session_id)
    return None


def _with_session(error: ProtocolError, request: Any, has_session: bool) -> ProtocolError:
    """An unknown-session error names the session it was about (``SessionNotFoundErrorData``),
    so a client can tell which of its sessions is gone."""
    if error.code != RESOURCE_NOT_FOUND or not has_session:
        return error
    if error.data is None:
        return ProtocolError(error.code, error.message, {"sessionId": request.session_id})
    if isinstance(error.data, dict) and "sessionId" not in error.data:
        data = {"sessionId": request.session_id, **error.data}
        return ProtocolError(error.code, error.message, data)
    return error


def _checked_session_id(request: Any) -> Any:
    """The shared input rule: a session id is trimmed, and a blank one is bad params."""
    session_id = request.session_id
    trimmed = session_id.strip()
    if not trimmed:
        raise ProtocolError(INVALID_PARAMS, "sessionId: must not be blank")
    return request if trimmed == session_id else attrs.evolve(request, session_id=trimmed)


class AcpConnection:
    """See the module docstring. Built and run by :class:`~maple_acp.edge.AcpService`, which
    hands it the runtime, its config, and callables for the ``initialize`` answer and the
    host status."""

    # The flows, built by ``run`` inside the connection's nursery (where they start tasks).
    closer: SessionCloser
    trust: TrustDialog
    turns: PromptTurns
    goals: GoalFlow
    opener: SessionOpener

    def __init__(
        self,
        stream: trio.abc.Stream | MessageTransport,
        *,
        runtime: AgentService,
        config: AcpServiceConfig,
        initialize_response: Callable[[], InitializeResponse],
        host_status: Callable[[], HostStatus],
        holder_of: Callable[[str], str | None] = lambda session_id: None,
    ) -> None:
        self.runtime = runtime
        self.config = config
        self._initialize_response = initialize_response
        self._host_status = host_status
        #: The ``clientInfo.name`` of the connection holding a session, if one of ours does.
        self._holder_of = holder_of
        #: This client's ``clientInfo.name`` (one safe line), once it has initialized.
        self.client_name: str | None = None
        self.peer = JsonRpcPeer(
            stream,
            on_request=self._on_request,
            on_notification=self._on_notification,
            max_line_bytes=config.max_line_bytes,
            max_outbound_lines=config.max_outbound_lines,
            max_outbound_bytes=config.max_outbound_bytes,
            on_eof=self._input_ended,
            order_key=order_key,
        )
        self.sessions = SessionTable(config.max_sessions_per_connection)
        self.client = ClientChannel(self.peer)
        self.relay = RelayValues({})
        self.dialect: Dialect = DIALECTS[0]
        self._initialized = False
        #: The latest ``session/cancel`` held for each session (see ``_cancel_in_order``).
        self._held_cancels: dict[str, int] = {}
        self._malformed = MalformedNotifications()
        #: Filled by ``run``: the flows live in the connection's nursery, so they are built
        #: once it is open (before that no request can arrive).
        self._operations: dict[str, Handler] = {}
        self._requests = self._dispatch_table(self.dialect)

    def _open_flows(self, nursery: trio.Nursery) -> None:
        """Build the flows inside ``nursery`` (the connection's) and route the methods to them."""
        table, channel, runtime, config = self.sessions, self.client, self.runtime, self.config
        self.closer = SessionCloser(table, runtime, nursery=nursery, ending=lambda: self.ending)
        self.trust = TrustDialog(channel)
        self.turns = PromptTurns(
            table,
            channel,
            settle_trust=self.trust.settle,
            nursery=nursery,
            accepts=runtime.prompt_capabilities,
        )
        self.goals = GoalFlow(table, channel, pump=self.turns.pump, forget=self.closer.forget)
        self.opener = SessionOpener(
            table,
            channel,
            runtime,
            config,
            nursery=nursery,
            relay=lambda: self.relay,
            dialect=lambda: self.dialect,
            watch=self.goals.pump_session_events,
            following=SessionFollowing(
                table,
                channel,
                runtime,
                roots=config.allowed_roots,
                nursery=nursery,
                dialect=lambda: self.dialect,
                forward=self.goals.forward,
            ),
        )
        operations: dict[str, Handler] = {
            "initialize": self._initialize,
            "new_session": self.opener.new,
            "load_session": self.opener.load,
            "fork_session": SessionForker(
                self.opener, runtime, config.allowed_roots, relay=lambda: self.relay
            ).fork,
            "resume_session": self.opener.resume,
            "list_sessions": self.opener.list,
            "prompt": self.turns.prompt,
            "close_session": self.closer.close,
            "set_config_option": self.opener.set_config_option,
            "set_mode": self.opener.set_mode,
            "goal_control": self.goals.control,
            "background": BackgroundFlow(table).control,
            "queue": QueueFlow(table).control,
            "steer": SteeringFlow(table, channel, pump=self.turns.pump, nursery=nursery).steer,
            "status": self._status,
            "transcript": self.opener.transcript,
        }
        if config.allow_session_delete:
            operations["delete_session"] = self.closer.delete
        self._operations = operations
        self._requests = self._dispatch_table(self.dialect)

    def _dispatch_table(self, dialect: Dialect) -> dict[str, tuple[Any, Handler, bool]]:
        """method -> (params type, handler, whether the params carry a session id)."""
        operations = self._operations
        return {
            method: (route.params, operations[route.operation], route.has_session_id)
            for method, route in dialect.routes.items()
            if route.operation in operations
        }

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
                self._open_flows(nursery)
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
        self.sessions.end()

    @property
    def ending(self) -> bool:
        """The connection is ending (the client finished sending, or the transport ended):
        its sessions end with it, none of them revoked by the runtime."""
        return self.sessions.ended or self.peer.closed

    def revoke_all(self) -> None:
        self.sessions.revoke_all()

    async def aclose(self) -> None:
        await self.peer.aclose()

    # -- dispatch ----------------------------------------------------------------------------

    async def _on_request(self, method: str, params: Any) -> Any:
        """Serve one request; at DEBUG, log its method, session, duration and outcome (never
        its params: they carry prompts, paths and MCP headers)."""
        if not logger.isEnabledFor(logging.DEBUG):
            return await self._serve_request(method, params)
        started = trio.current_time()
        session = params.get("sessionId") if isinstance(params, dict) else None
        where = (
            f" session {one_line(session, MAX_LOGGED_ID_CHARS)}" if isinstance(session, str) else ""
        )
        outcome = "cancelled"
        try:
            result = await self._serve_request(method, params)
            outcome = "ok"
            return result
        except ProtocolError as exc:
            outcome = f"error {exc.code}"
            raise
        except Exception as exc:
            outcome = f"failed ({type(exc).__name__})"
            raise
        finally:
            logger.debug(
                "request %s%s: %s in %.3f s",
                one_line(method, MAX_LOGGED_ID_CHARS),
                where,
                outcome,
                trio.current_time() - started,
            )

    async def _serve_request(self, method: str, params: Any) -> Any:
        if method == "initialize" and not self._initialized:
            # The version decides the params' shape, so it is chosen from the raw request.
            requested = params.get("protocolVersion") if isinstance(params, dict) else None
            self._use(choose_dialect(requested, self.config.protocol_max))
        entry = self._requests.get(method)
        if entry is None:
            raise method_not_found(method)
        params_type, handler, has_session = entry
        request = structure_params(params, params_type)
        if has_session:
            request = _checked_session_id(request)
        try:
            response = await handler(request)
        except RuntimeRejection as exc:
            if exc.kind is RejectionKind.TASK_LEASED and has_session:
                exc = self._held_elsewhere(exc, request.session_id)
            raise _with_session(protocol_error(exc), request, has_session) from None
        except ExternalMcpError as exc:
            raise _with_session(protocol_error(exc), request, has_session) from None
        except ProtocolError as exc:
            raise _with_session(exc, request, has_session) from None
        return unstructure(response)

    def _use(self, dialect: Dialect) -> None:
        if dialect is not self.dialect:
            self.dialect = dialect
            self._requests = self._dispatch_table(dialect)
            self.peer.accept_batches = dialect.accepts_batches

    async def _on_notification(self, method: str, params: Any) -> None:
        if method == "session/cancel":
            try:
                request = _checked_session_id(structure_params(params, CancelNotification))
            except ProtocolError as exc:
                self._malformed.ignore(method, exc.message)
                return
            self._cancel_in_order(request.session_id)
        elif method == BRIDGE_HELLO_METHOD:
            self._hello(params)
        else:
            logger.debug("ignoring notification %r", method[:64])

    def _cancel_in_order(self, session_id: str) -> None:
        """Cancel what arrived before this ``session/cancel`` for the session, once every
        request about it that arrived earlier has decided: a prompt still waiting for its turn,
        or one behind the load that opens the session, is reached too.

        At most one cancel per session is held: a later one stands for the earlier (it ends
        all they would end, and more), so a flood of cancels behind a slow load holds one."""
        arrival = self.peer.frames_received
        held = self._held_cancels
        if session_id in held:
            held[session_id] = arrival
            return
        held[session_id] = arrival

        def cancel() -> None:
            latest = held.pop(session_id)
            session = self.sessions.get(session_id)
            if session is not None:
                session.cancel_prompt(latest)
            else:
                cancel_child(self.sessions.children(), session_id)

        self.peer.in_order(session_key(session_id), cancel)

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

    # -- initialize and status ---------------------------------------------------------------

    def _held_elsewhere(self, exc: RuntimeRejection, session_id: str) -> RuntimeRejection:
        """A session open in another client: name that client and say how to free it."""
        holder = self._holder_of(session_id)
        where = f"in {holder}" if holder else "in another client"
        return RuntimeRejection(
            exc.kind,
            f"the session is open {where}; close it there (or quit that client) to open it here",
        )

    async def _initialize(self, request: InitializeParams) -> object:
        # A later initialize keeps the version: one connection speaks one for its life.
        self._initialized = True
        info = getattr(request, "client_info", None)
        name = getattr(info, "name", None)
        if isinstance(name, str) and name.strip():
            self.client_name = one_line(name, MAX_CLIENT_NAME_CHARS)
        dialect = self.dialect
        self.client.features = dialect.client_features(request)
        return dialect.initialize_answer(self._initialize_response())

    async def _status(self, request: StatusRequest) -> HostStatus:
        return self._host_status()

    @property
    def active_runs(self) -> int:
        return self.sessions.active_runs
