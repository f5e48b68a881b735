"""``AcpService``: the ACP edge over any listener (the Unix socket, the network), stdio, or
any stream."""

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
from maple_acp.edge._connection import DISCONNECT_CLEANUP_S, AcpConnection
from maple_acp.edge._goals import GOAL_ACTIONS
from maple_acp.edge._v1 import VERSION
from maple_acp.listeners import Listener, RunningListeners
from maple_acp.rpc import MessageTransport
from maple_acp.runtime import MAX_QUEUED_PROMPTS, AgentService
from maple_acp.runtime import PromptCapabilities as BackendPromptCapabilities
from maple_acp.wire import (
    PROMPT_QUEUE_META_KEY,
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
#: How long :meth:`AcpService.stop` waits for the connections it closed to end before it
#: cancels the listeners serving them: each ends within its own cleanup bound, and a second
#: more lets the listener send what the close wrote (a network stream's last bytes).
STOP_DEADLINE_S: Final = DISCONNECT_CLEANUP_S + 1.0


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
            mcp_capabilities=McpCapabilities(http=True, sse=False, acp=True),
            session_capabilities=SessionCapabilities(
                list=SessionListCapabilities(),
                close=SessionCloseCapabilities(),
                resume=SessionResumeCapabilities(),
                delete=SessionDeleteCapabilities() if config.allow_session_delete else None,
                additional_directories=SessionAdditionalDirectoriesCapabilities(),
                fork=SessionForkCapabilities(),
            ),
            # The prompt queue's extension: a prompt sent while a turn runs waits its turn.
            meta={PROMPT_QUEUE_META_KEY: {"max": MAX_QUEUED_PROMPTS}},
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
    #: Where the first listener started serves (the socket's path for the CLI host).
    endpoint: str | None
    connections: int
    sessions: int
    active_runs: int
    #: Where each running listener serves, in the order they started.
    listening: tuple[str, ...] = ()


class ConnectionGate:
    """Counts live connections against the configured maximum (sans-I/O): one count for
    every listener and transport."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.active = 0

    def try_admit(self) -> bool:
        if self.active >= self.maximum:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1


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

    Serve it through any number of listeners (:meth:`listen`: the owner-only Unix socket
    the connector reaches, ``maple_acp.listeners.UnixListener``, and the network,
    ``maple_acp.net.NetworkListener``, side by side, in one connection limit),
    :meth:`serve_stdio` (this process's stdin/stdout as one connection) or
    :meth:`serve_stream` (any Trio stream: tests, custom transports). :meth:`start` /
    :meth:`stop` / :meth:`restore_enabled` add the host-facing lifecycle of the Unix socket,
    with the enabled/disabled choice persisted per account when ``state_dir`` is given;
    :meth:`stop` ends every listener.
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
        #: The listeners running, in the order they started.
        self._listeners = RunningListeners(self)
        self._initialize_response = initialize_response(self._config, runtime.prompt_capabilities)
        #: Set when a connection ends (a new event each time :meth:`stop` waits on it).
        self._connection_ended = trio.Event()
        #: While :meth:`stop` runs, no listener may admit a connection.
        self._stopping = False
        #: Connection slots, shared by every listener and transport.
        self._gate = ConnectionGate(self._config.max_connections)

    # -- configuration -----------------------------------------------------------------------

    @property
    def config(self) -> AcpServiceConfig:
        return self._config

    @property
    def running(self) -> bool:
        """Whether any listener runs."""
        return bool(self._listeners)

    def set_config(self, config: AcpServiceConfig) -> None:
        """Change the policy. Refused while a listener runs: stop, change, start."""
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
        listening = self._listeners.addresses
        return AcpServiceStatus(
            running=self.running,
            endpoint=listening[0] if listening else None,
            connections=len(self._connections),
            sessions=sum(len(c.sessions) for c in self._connections),
            active_runs=sum(c.active_runs for c in self._connections),
            listening=listening,
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
            session = connection.sessions.get(session_id)
            # A connection that only observes the session does not hold it.
            if session is not None and session.observer is None:
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
        """Take a connection slot for a connection a listener accepted; ``False`` when every
        slot is in use or the service is stopping. Give it back with :meth:`release`."""
        return not self._stopping and self._gate.try_admit()

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
            self._connection_ended.set()

    async def serve_stdio(self) -> None:
        """Serve this process's stdin/stdout as one connection (logs must go to stderr)."""
        stdin = trio.lowlevel.FdStream(os.dup(0))
        stdout = trio.lowlevel.FdStream(os.dup(1))
        await self.serve_stream(trio.StapledStream(stdout, stdin))

    async def listen(self, nursery: trio.Nursery, listener: Listener) -> str:
        """Start ``listener`` in ``nursery`` serving this service; return where it serves (the
        socket's path, the URL) once clients can connect. :meth:`stop` ends it.

        Resource handling: the listener and every connection it accepted end when
        :meth:`stop` is called or ``nursery`` is cancelled (each connection within its cleanup
        deadline); what it bound is released before it is reported stopped.

        Error handling: whatever the listener refuses to start with (``ListenerError`` for an
        endpoint the Unix socket rules refuse, ``maple_acp.net.HttpSetupError`` or ``OSError``
        for the network) propagates from here, and nothing listens.
        """
        return await self._listeners.start(nursery, listener)

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

    async def start(self, nursery: trio.Nursery, listener: Listener) -> str:
        """:meth:`listen` with ``listener`` (the host's Unix socket, a
        ``maple_acp.listeners.UnixListener``), then persist "enabled" for the signed-in
        account; return where it serves. Then, in the background, the wire codecs are built
        (see :func:`_warm_codecs`)."""
        endpoint = await self.listen(nursery, listener)
        self._persist(True)
        nursery.start_soon(_warm_codecs)
        return endpoint

    async def stop(self, *, persist: bool = True) -> None:
        """End every connection, then stop every listener; with ``persist`` (a user's
        choice), save "disabled" so the next sign-in does not restore the listener.

        The listeners admit nothing from the start; each connection is closed as a client's
        end would close it (its leases revoked, its streams ended in order), and the listeners
        are cancelled once those have ended, or after :data:`STOP_DEADLINE_S`, which ends
        whatever is left of them.
        """
        self._stopping = True
        try:
            for connection in list(self._connections):
                await connection.aclose()
            with trio.move_on_after(STOP_DEADLINE_S):
                while self._connections:
                    self._connection_ended = trio.Event()
                    await self._connection_ended.wait()
            await self._listeners.stop()
        finally:
            self._stopping = False
        if persist:
            self._persist(False)

    async def restore_enabled(self, nursery: trio.Nursery, listener: Listener) -> bool:
        """After sign-in: start ``listener`` (the host's Unix socket) if the account left it
        enabled, with the policy saved for that account. True if it was started."""
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
        await self.listen(nursery, listener)
        return True


async def _warm_codecs() -> None:
    """Build the wire converter's per-type functions now, one type at a time between other
    work, rather than on the first requests of the first client (a fresh host's first prompt
    otherwise pays tens of milliseconds of code generation before reaching its backend)."""
    for _ in warm_codecs():
        await trio.lowlevel.checkpoint()
