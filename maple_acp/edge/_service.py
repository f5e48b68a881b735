"""``AcpService``: the ACP edge over a Unix socket, stdio, or any stream."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from maple_acp.edge._config import (
    AcpServiceConfig,
    ConfigError,
    PersistedServiceState,
    ServiceStateFile,
)
from maple_acp.edge._connection import AcpConnection
from maple_acp.edge._goals import GOAL_ACTIONS
from maple_acp.edge._listener import ConnectionGate, serve_endpoint
from maple_acp.edge._v1 import VERSION
from maple_acp.rpc import MessageTransport
from maple_acp.runtime import AgentService
from maple_acp.runtime import PromptCapabilities as BackendPromptCapabilities
from maple_acp.wire import (
    AgentCapabilities,
    GoalCapability,
    HostStatus,
    Implementation,
    InitializeResponse,
    McpCapabilities,
    PromptCapabilities,
    SessionAdditionalDirectoriesCapabilities,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionDeleteCapabilities,
    SessionForkCapabilities,
    SessionListCapabilities,
    SessionResumeCapabilities,
    goal_capability_meta,
    steering_capability_meta,
    warm_codecs,
)
from maple_acp_connector import __version__

logger = logging.getLogger(__name__)

#: The version in the ``initialize`` answer's template: v1, the oldest this agent speaks. The
#: dialect chosen for a connection (``DIALECTS`` in ``_connection``) answers with its own.
PROTOCOL_VERSION: Final = VERSION


def initialize_response(
    config: AcpServiceConfig, accepts: BackendPromptCapabilities | None = None
) -> InitializeResponse:
    """The initialize answer: version 1 and exactly what this agent supports (deletion only
    when the host's policy allows it; images and embedded context only when the host's
    backend declares them)."""
    accepts = accepts or BackendPromptCapabilities()
    return InitializeResponse(
        protocol_version=PROTOCOL_VERSION,
        agent_capabilities=AgentCapabilities(
            load_session=True,
            prompt_capabilities=PromptCapabilities(
                image=accepts.image, audio=False, embedded_context=accepts.embedded_context
            ),
            mcp_capabilities=McpCapabilities(http=True, sse=False),
            session_capabilities=SessionCapabilities(
                list=SessionListCapabilities(),
                close=SessionCloseCapabilities(),
                resume=SessionResumeCapabilities(),
                delete=SessionDeleteCapabilities() if config.allow_session_delete else None,
                additional_directories=SessionAdditionalDirectoriesCapabilities(),
                fork=SessionForkCapabilities(),
            ),
        ),
        auth_methods=(),
        agent_info=Implementation(
            name=config.agent_name, title=config.agent_title, version=__version__
        ),
        meta={
            **goal_capability_meta(GoalCapability(actions=GOAL_ACTIONS)),
            **steering_capability_meta(),
        },
    )


@attrs.frozen(kw_only=True)
class AcpServiceStatus:
    running: bool
    endpoint: str | None
    connections: int
    sessions: int
    active_runs: int


@attrs.frozen(kw_only=True)
class ConnectionView:
    """One live ACP connection, as a host's window shows it."""

    #: Its place in the order this service accepted connections (1 for the first).
    number: int
    #: The sessions it holds (closing ones included), in the order opened.
    session_ids: tuple[str, ...]
    active_runs: int


class AcpService:
    """Exposes an :class:`~maple_acp.runtime.AgentService` to ACP clients.

    Serve it one of three ways: :meth:`serve_unix` (the owner-only socket the connector
    reaches), :meth:`serve_stdio` (this process's stdin/stdout as one connection) or
    :meth:`serve_stream` (any Trio stream: tests, custom transports). :meth:`start` /
    :meth:`stop` / :meth:`restore_enabled` add the host-facing lifecycle, with the
    enabled/disabled choice persisted per account when ``state_dir`` is given.
    ``engine_status``, when given, adds the host's own description of its engine (its
    backend, default model, providers) to ``_maple/status`` as ``engine``.
    """

    def __init__(
        self,
        runtime: AgentService,
        config: AcpServiceConfig | None = None,
        *,
        state_dir: Path | None = None,
        engine_status: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.runtime = runtime
        #: What ``_maple/status`` reports about the host's engine (its backend, providers).
        self._engine_status = engine_status
        self._config = config or AcpServiceConfig()
        self._state = ServiceStateFile(state_dir) if state_dir is not None else None
        #: Each live connection and its number (see ``ConnectionView``).
        self._connections: dict[AcpConnection, int] = {}
        self._accepted = 0
        self._endpoint: Path | None = None
        self._listener_scope: trio.CancelScope | None = None
        self._stopped: trio.Event | None = None
        self._initialize_response = initialize_response(self._config, runtime.prompt_capabilities)
        #: Connection slots, shared by every transport (the socket and the network listener).
        self._gate = ConnectionGate(self._config.max_connections)

    # -- configuration -----------------------------------------------------------------------

    @property
    def config(self) -> AcpServiceConfig:
        return self._config

    @property
    def running(self) -> bool:
        return self._listener_scope is not None

    def set_config(self, config: AcpServiceConfig) -> None:
        """Change the policy. Refused while the listener runs: stop, change, start."""
        if self.running:
            raise ConfigError("stop the ACP service before changing its policy")
        self._config = config
        self._initialize_response = initialize_response(config, self.runtime.prompt_capabilities)
        self._gate.maximum = config.max_connections

    @property
    def initialize_response(self) -> InitializeResponse:
        """What ``initialize`` answers under the current policy."""
        return self._initialize_response

    def status(self) -> AcpServiceStatus:
        return AcpServiceStatus(
            running=self.running,
            endpoint=str(self._endpoint) if self._endpoint is not None else None,
            connections=len(self._connections),
            sessions=sum(len(c.sessions) for c in self._connections),
            active_runs=sum(c.active_runs for c in self._connections),
        )

    def connections(self) -> tuple[ConnectionView, ...]:
        """The live connections, oldest first: for a host's own window (synchronous)."""
        return tuple(
            ConnectionView(
                number=number,
                session_ids=connection.sessions.ids(),
                active_runs=connection.active_runs,
            )
            for connection, number in self._connections.items()
        )

    def _holder_of(self, session_id: str) -> str | None:
        """The ``clientInfo.name`` of the connection holding ``session_id``, if any told us."""
        for connection in self._connections:
            if connection.sessions.get(session_id) is not None:
                return connection.client_name
        return None

    def host_status(self) -> HostStatus:
        """``_maple/status``: this service's and the runtime's figures."""
        acp = self.status()
        runtime = self.runtime.status()
        return HostStatus(
            running=acp.running,
            endpoint=acp.endpoint,
            connections=acp.connections,
            sessions=acp.sessions,
            active_runs=runtime.active_runs,
            leases=runtime.leases,
            signed_in=runtime.account is not None,
            engine=self._engine_status() if self._engine_status is not None else None,
        )

    # -- serving -----------------------------------------------------------------------------

    def try_admit(self) -> bool:
        """Take a connection slot for a connection another transport accepted (the network
        listener); ``False`` when every slot is in use. Give it back with :meth:`release`."""
        return self._gate.try_admit()

    def release(self) -> None:
        self._gate.release()

    async def session_exists(self, session_id: str) -> bool:
        """Whether a session by this id is open here or stored for the signed-in account."""
        if any(connection.sessions.get(session_id) is not None for connection in self._connections):
            return True
        return await self.runtime.has_task(session_id)

    async def serve_stream(self, stream: trio.abc.Stream | MessageTransport) -> None:
        """Serve one ACP connection over ``stream`` (a byte stream, or a transport of whole
        messages such as the network's) until it ends.

        Resource handling: the stream is closed when this returns; every lease the connection
        took is revoked and released (bounded) before it returns.
        """
        connection = AcpConnection(
            stream,
            runtime=self.runtime,
            config=self._config,
            initialize_response=lambda: self._initialize_response,
            host_status=self.host_status,
            holder_of=self._holder_of,
        )
        self._accepted += 1
        self._connections[connection] = self._accepted
        try:
            await connection.run()
        finally:
            del self._connections[connection]

    async def serve_stdio(self) -> None:
        """Serve this process's stdin/stdout as one connection (logs must go to stderr)."""
        stdin = trio.lowlevel.FdStream(os.dup(0))
        stdout = trio.lowlevel.FdStream(os.dup(1))
        await self.serve_stream(trio.StapledStream(stdout, stdin))

    async def serve_unix(
        self, path: Path, *, task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on the owner-only Unix socket at ``path`` until cancelled or :meth:`stop`.

        Resource handling: the socket file exists exactly while this runs (a stale one is
        replaced, ours is removed on exit); every connection ends when this returns.

        Error handling: :class:`~maple_acp.edge.ListenerError` before ``task_status.started``
        when the endpoint rules refuse the path (a symlink, a non-socket, a shared directory,
        a live service already there). Connections beyond ``max_connections`` are closed at
        accept and logged.
        """
        if self.running:
            raise RuntimeError("the ACP service is already running")
        gate = self._gate
        self._stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._listener_scope = scope
                self._endpoint = path
                await serve_endpoint(path, self.serve_stream, gate, task_status=task_status)
        finally:
            self._listener_scope = None
            self._endpoint = None
            self._stopped.set()

    # -- host lifecycle ----------------------------------------------------------------------

    def _persist(self, enabled: bool) -> None:
        account = self.runtime.account
        if self._state is None or account is None:
            return
        self._state.save(
            account,
            PersistedServiceState(
                enabled=enabled,
                allowed_roots=self._config.allowed_roots,
                max_connections=self._config.max_connections,
            ),
        )

    async def start(self, nursery: trio.Nursery, path: Path) -> Path:
        """Start listening in ``nursery`` and persist "enabled" for the signed-in account.
        Then, in the background, the wire codecs are built (see :func:`_warm_codecs`)."""
        endpoint: Path = await nursery.start(self.serve_unix, path)
        self._persist(True)
        nursery.start_soon(_warm_codecs)
        return endpoint

    async def stop(self, *, persist: bool = True) -> None:
        """Stop listening and end every connection; with ``persist`` (a user's choice), save
        "disabled" so the next sign-in does not restore the listener."""
        scope, stopped = self._listener_scope, self._stopped
        if scope is not None and stopped is not None:
            scope.cancel()
            await stopped.wait()
        for connection in list(self._connections):
            await connection.aclose()
        if persist:
            self._persist(False)

    async def restore_enabled(self, nursery: trio.Nursery, path: Path) -> bool:
        """After sign-in: start the listener if the account left it enabled, with the policy
        saved for that account. True if it was started."""
        account = self.runtime.account
        if self._state is None or account is None or self.running:
            return False
        saved = self._state.load(account)
        if not saved.enabled:
            return False
        self.set_config(
            attrs.evolve(
                self._config,
                allowed_roots=saved.allowed_roots,
                max_connections=saved.max_connections,
            )
        )
        await nursery.start(self.serve_unix, path)
        return True


async def _warm_codecs() -> None:
    """Build the wire converter's per-type functions now, one type at a time between other
    work, rather than on the first requests of the first client (a fresh host's first prompt
    otherwise pays tens of milliseconds of code generation before reaching its backend)."""
    for _ in warm_codecs():
        await trio.lowlevel.checkpoint()
