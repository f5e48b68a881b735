"""Opening sessions: ``session/new``, ``session/load``, ``session/resume``, and a session's
settings (``session/list``, ``session/set_mode``, ``session/set_config_option``).

Admission rules (cwd canonicalisation, allowed roots - the runtime's and this service's own -,
relay values, task ownership) are the runtime's; this module asks the runtime for a lease and
shapes the answer. MCP definitions are validated before
anything is created. A load or resume of a session this connection already holds is a
re-attach: the request's MCP servers replace the lease's (the new set connects first), and a
load replays the history again.

A connection holds at most :data:`MAX_SESSIONS_PER_CONNECTION` sessions (the service's config
may lower it): an open that would add one more answers ``-32600`` before anything is created
or persisted. Opens still being set up count, so concurrent requests cannot overshoot.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import trio

from maple_acp.edge._errors import unknown_session
from maple_acp.edge._projection import (
    MODE_ID,
    MODE_OPTION_ID,
    MODEL_OPTION_ID,
    config_options,
    mode_state,
)
from maple_acp.edge._prompt import mcp_definitions
from maple_acp.edge._session import EdgeSession, SessionClosed
from maple_acp.mcp import ValidatedServer, validate_servers
from maple_acp.rpc import after_answer
from maple_acp.runtime import SessionLease, canonical_directory
from maple_acp.wire import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    ListSessionsRequest,
    ListSessionsResponse,
    LoadSessionRequest,
    LoadSessionResponse,
    McpServer,
    NewSessionRequest,
    NewSessionResponse,
    ProtocolError,
    ResumeSessionRequest,
    ResumeSessionResponse,
    SessionInfo,
    SetSessionConfigOptionRequest,
    SetSessionConfigOptionResponse,
    SetSessionModeRequest,
    SetSessionModeResponse,
)

if TYPE_CHECKING:
    from maple_acp.edge._connection import AcpConnection
    from maple_acp.mcp import McpRouter

logger = logging.getLogger(__name__)

RouterFactory = Callable[[trio.Nursery], Awaitable["McpRouter"]]

#: Sessions one connection may hold (SPEC.md limits): releasing them all when the connection
#: ends must fit the five-second cleanup bound without stalling other connections.
MAX_SESSIONS_PER_CONNECTION: Final = 256


def _iso8601(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def _no_additional(directories: tuple[str, ...]) -> None:
    if directories:
        raise ProtocolError(INVALID_PARAMS, "additionalDirectories is not supported")


def router_factory(servers: tuple[ValidatedServer, ...]) -> RouterFactory | None:
    """What the runtime runs inside a lease's nursery to connect its MCP servers."""
    if not servers:
        return None

    async def start(nursery: trio.Nursery) -> McpRouter:
        # Imported here: the MCP SDK loads only when a session brings servers.
        from maple_acp.mcp import McpRouter

        router = McpRouter(servers)
        await nursery.start(router.serve)
        return router

    return start


class SessionOpener:
    """``session/new``, ``/load``, ``/resume``, ``/list`` and the session settings for one
    connection."""

    def __init__(self, connection: AcpConnection) -> None:
        self.connection = connection
        #: Opens admitted under the session cap whose lease is still being set up.
        self._opening = 0

    @property
    def _roots(self) -> tuple[str, ...]:
        """This service's own allowed roots, which the runtime applies with its own."""
        return self.connection.config.allowed_roots

    def _check_room(self) -> None:
        """``-32600`` if one more session would exceed the connection's cap."""
        cap = self.connection.config.max_sessions_per_connection
        if len(self.connection.sessions) + self._opening >= cap:
            raise ProtocolError(
                INVALID_REQUEST, f"this connection already holds {cap} sessions; close some first"
            )

    async def _open(self, start: Callable[..., Awaitable[None]]) -> EdgeSession:
        connection = self.connection
        self._check_room()
        self._opening += 1
        try:
            lease: SessionLease = await connection.nursery.start(start)
        finally:
            # No checkpoint from here to the registration below: the slot passes from the
            # pending count to ``sessions`` at once.
            self._opening -= 1
        # Registered before any other checkpoint, so a disconnect from here on revokes it.
        session = EdgeSession(lease, connection.runtime.cached_model_choices())
        connection.sessions[session.id] = session
        if connection.ended:
            # Set up after the client finished sending: revoked like every other session, and
            # the request still gets its own answer.
            connection.revoke_all()
            raise ProtocolError(
                INVALID_REQUEST, "the connection is ending: the client finished sending"
            )
        connection.nursery.start_soon(connection.goals.pump_session_events, session)
        # The catalog listing is cached by the runtime (one bounded discovery, then warm).
        session.choices = await lease.model_choices()
        return session

    def _options(self, session: EdgeSession) -> Any:
        return config_options(session.choices, session.current_model, locked=session.model_locked)

    async def new(self, request: NewSessionRequest) -> NewSessionResponse:
        connection = self.connection
        _no_additional(request.additional_directories)
        servers = validate_servers(mcp_definitions(request.mcp_servers))
        # The runtime canonicalises the cwd, once, and applies both sets of allowed roots.
        session = await self._open(
            partial(
                connection.runtime.serve_new_task,
                request.cwd,
                relay=connection.relay,
                router_factory=router_factory(servers),
                allowed_roots=self._roots,
            )
        )
        logger.info("session %s created", session.id)
        await self._after_answer(session)
        return NewSessionResponse(
            session_id=session.id, modes=mode_state(), config_options=self._options(session)
        )

    async def _attach(
        self,
        session_id: str,
        cwd: str,
        additional: tuple[str, ...],
        mcp_servers: tuple[McpServer, ...],
    ) -> EdgeSession:
        """A lease on the task ``session_id`` for this connection: a new one, or the one this
        connection holds already (a re-attach, when no prompt runs)."""
        connection = self.connection
        if session_id in connection.tombstones:
            raise ProtocolError(INVALID_REQUEST, "the session is closing")
        _no_additional(additional)
        servers = validate_servers(mcp_definitions(mcp_servers))
        held = connection.sessions.get(session_id)
        if held is not None and not held.closing:
            return await self._reattach(held, cwd, servers)
        if held is not None:
            raise ProtocolError(INVALID_REQUEST, "the session is closing")
        return await self._open(
            partial(
                connection.runtime.serve_task,
                session_id,
                cwd,
                relay=connection.relay,
                router_factory=router_factory(servers),
                allowed_roots=self._roots,
            )
        )

    async def _reattach(
        self, session: EdgeSession, cwd: str, servers: tuple[ValidatedServer, ...]
    ) -> EdgeSession:
        # The lease holds the task already: the cwd must name its root, as on a first load.
        if await canonical_directory(cwd) != session.lease.task.root:
            raise ProtocolError(INVALID_PARAMS, "cwd is not the session's working directory")
        # RUN_ACTIVE (-32600) while a prompt or a goal cycle runs; if the new servers fail to
        # connect, the lease keeps its old ones and their error is the answer.
        await session.lease.replace_router(router_factory(servers))
        return session

    async def load(self, request: LoadSessionRequest) -> LoadSessionResponse:
        session = await self._attach(
            request.session_id, request.cwd, request.additional_directories, request.mcp_servers
        )
        # Replay the visible history before answering, through the live projector.
        connection = self.connection
        with session.lease.operation(), session.update_scope():
            await connection.send_many(session.projector.history(await session.lease.replay_rows()))
            task = session.lease.task
            if task.title:
                await connection.send(session.projector.title(task.title))
            goal = session.lease.goal
            if goal is not None:
                await connection.send(session.projector.goal(goal))
        if session.stopped:
            raise unknown_session()
        logger.info("session %s loaded", session.id)
        await self._after_answer(session)
        return LoadSessionResponse(modes=mode_state(), config_options=self._options(session))

    async def resume(self, request: ResumeSessionRequest) -> ResumeSessionResponse:
        session = await self._attach(
            request.session_id, request.cwd, request.additional_directories, request.mcp_servers
        )
        if session.stopped:
            raise unknown_session()
        logger.info("session %s resumed", session.id)
        await self._after_answer(session, goal=True)
        return ResumeSessionResponse(modes=mode_state(), config_options=self._options(session))

    async def _after_answer(self, session: EdgeSession, *, goal: bool = False) -> None:
        """Updates that follow an open answer: the session's commands (and, for a resume, its
        goal). They are sent once the answer is queued: a client must know the session id
        before updates about it arrive."""
        commands = session.lease.commands
        snapshot = session.lease.goal if goal else None
        if not commands and snapshot is None:
            return

        async def follow() -> None:
            try:
                with session.update_scope():
                    if commands:
                        await self.connection.send(session.projector.commands(commands))
                    if snapshot is not None:
                        await self.connection.send(session.projector.goal(snapshot))
            except SessionClosed:
                pass

        after_answer(follow)

    async def list(self, request: ListSessionsRequest) -> ListSessionsResponse:
        listing = await self.connection.runtime.list_tasks(
            cwd=request.cwd, cursor=request.cursor, allowed_roots=self._roots
        )
        sessions = tuple(
            SessionInfo(
                session_id=task.id,
                cwd=task.root,
                title=task.title or None,
                updated_at=_iso8601(task.updated_ms),
            )
            for task in listing.tasks
        )
        return ListSessionsResponse(sessions=sessions, next_cursor=listing.next_cursor)

    async def set_mode(self, request: SetSessionModeRequest) -> SetSessionModeResponse:
        self.connection.session(request.session_id)
        if request.mode_id != MODE_ID:
            raise ProtocolError(INVALID_PARAMS, f"modeId: the only mode is {MODE_ID!r}")
        return SetSessionModeResponse()

    async def set_config_option(
        self, request: SetSessionConfigOptionRequest
    ) -> SetSessionConfigOptionResponse:
        session = self.connection.session(request.session_id)
        value = request.value
        if request.config_id == MODEL_OPTION_ID:
            if not isinstance(value, str):
                raise ProtocolError(INVALID_PARAMS, "value: expected a model id")
            await session.lease.set_model(value)
        elif request.config_id == MODE_OPTION_ID:
            if value != MODE_ID:
                raise ProtocolError(INVALID_PARAMS, f"value: the only mode is {MODE_ID!r}")
        else:
            raise ProtocolError(INVALID_PARAMS, "configId: unknown config option")
        return SetSessionConfigOptionResponse(config_options=self._options(session))
