"""The lease-scoped router: one MCP client session per transient server, a frozen catalog, calls.

Each server's session is owned by exactly one task, which enters the HTTP client, the
streamable-HTTP transport and the MCP session with ``async with`` and leaves them only when its
release event is set. Leaving normally is what makes the transport send the ``DELETE`` that ends
the server-side session; cancelling that ``async with`` instead would skip it and leak the
session. So the owning tasks are shielded from outside cancellation and bounded by their own
deadlines, and revocation is a synchronous method that sets events and cancels scopes.

This module is the router: the life of the client sessions of one lease's servers (setup,
catalog freeze, calls, revocation), which share the owning-task and deadline rules above.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import httpx2
import pydantic
import trio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from maple_acp._text import one_line
from maple_acp.mcp._acp_stream import (
    McpMessageChannel,
    client_side_handshake,
    client_side_session,
    tool_call_meta,
)
from maple_acp.mcp._catalog import (
    ExternalToolDefinition,
    FrozenTool,
    ServerCatalog,
    build_tool_definition,
    freeze_catalog,
    sanitise_result,
)
from maple_acp.mcp._definitions import ValidatedServer, describe_server
from maple_acp.mcp._errors import ExternalToolError, McpSetupError
from maple_acp.mcp._http_transport import (
    MAX_SSE_EVENT_BYTES,
    BoundedTransport,
    HiddenTargetTransport,
    stand_in_url,
)
from maple_acp.mcp._sdk_logs import install as _install_sdk_log_filter

logger = logging.getLogger(__name__)
_install_sdk_log_filter()

#: Connecting to every server and discovering every catalog shares this one deadline.
SETUP_TIMEOUT_SECONDS: Final = 30.0
#: One external tool call; the model's turn must not hang on a remote server.
CALL_TIMEOUT_SECONDS: Final = 30.0
#: Leaving a session (the DELETE) after revocation; matches the lease cleanup bound.
SESSION_CLOSE_TIMEOUT_SECONDS: Final = 5.0
#: TCP connect to a loopback server; anything slower is a dead server.
HTTP_CONNECT_TIMEOUT_SECONDS: Final = 10.0
#: Sending one request body; bodies are small (calls, notifications).
HTTP_WRITE_TIMEOUT_SECONDS: Final = 10.0
#: Waiting for a pooled connection.
HTTP_POOL_TIMEOUT_SECONDS: Final = 10.0
#: Silence on a response stream; above the call timeout so the call's own deadline decides.
HTTP_READ_TIMEOUT_SECONDS: Final = CALL_TIMEOUT_SECONDS + 5.0
#: Server-supplied error text quoted in a call error.
MAX_QUOTED_SERVER_TEXT: Final = 200
#: Header values shorter than this are not redacted from server text (they would match noise).
_MIN_REDACTED_CHARS: Final = 4

#: The error every call gets once the lease revoked the router.
REVOKED_MESSAGE: Final = "External MCP tools are no longer available"

_CLIENT_INFO: Final = types.Implementation(name="maple-acp", version="1")


class _Connection:
    """Mutable state of one server's session, shared by its owning task and callers."""

    def __init__(self, server: ValidatedServer) -> None:
        self.server: ValidatedServer | None = server
        self.where = describe_server(server.index, server.name)
        self.index = server.index
        self.key = server.key
        #: The server lives in the client, reached through ``mcp/message``.
        self.client_side = server.server_id is not None
        self.session: ClientSession | None = None
        self.tools: tuple[FrozenTool, ...] = ()
        self.error: McpSetupError | None = None
        self.setup_scope: trio.CancelScope | None = None
        self.setup_done = trio.Event()
        self.release = trio.Event()
        self.session_lost = False
        #: The user was told once that this server dropped its session.
        self.drop_told = False
        self.redirected = False
        self.http_status: int | None = None
        # Kept only to scrub server-supplied text; dropped at revocation with everything else.
        self.secrets: tuple[str, ...] = tuple(
            value for _, value in server.headers if len(value) >= _MIN_REDACTED_CHARS
        )

    async def observe_response(self, response: httpx2.Response) -> None:
        """httpx event hook: remember what the transport would otherwise only log."""
        status = response.status_code
        if status == 404 and "mcp-session-id" in response.request.headers:
            # The server no longer knows our session; the SDK turns this into a generic error.
            if response.request.method != "DELETE":
                self.session_lost = True
        elif 300 <= status < 400:
            self.redirected = True
        elif status >= 400:
            self.http_status = status

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "[redacted]")
        return one_line(text, limit=MAX_QUOTED_SERVER_TEXT)


class McpRouter:
    """The transient MCP servers of one lease, behind one ``external_mcp`` tool.

    Start it in the lease's nursery; ``start`` returns once every server is connected and the
    catalog is frozen::

        router = McpRouter(validated)
        await lease_nursery.start(router.serve)
        definition = router.tool_definition()
        result = await router.call("server__tool", {"x": 1})
        router.revoke()              # synchronous: close, disconnect, lease loss
        await router.wait_closed()   # every session ended (DELETE sent), every call finished
    """

    def __init__(
        self,
        servers: Sequence[ValidatedServer],
        *,
        channel: McpMessageChannel | None = None,
        setup_timeout: float = SETUP_TIMEOUT_SECONDS,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        """``channel`` reaches the servers that live in the client (``server_id`` set): the
        connection that declared them."""
        if not 0 < setup_timeout <= SETUP_TIMEOUT_SECONDS:
            raise ValueError(f"setup_timeout must be in (0, {SETUP_TIMEOUT_SECONDS}]")
        if not 0 < call_timeout <= CALL_TIMEOUT_SECONDS:
            raise ValueError(f"call_timeout must be in (0, {CALL_TIMEOUT_SECONDS}]")
        self._setup_timeout = setup_timeout
        self._call_timeout = call_timeout
        self._channel = channel
        self._connections = [_Connection(server) for server in servers]
        self._catalog: dict[str, FrozenTool] = {}
        self._definition: ExternalToolDefinition | None = None
        self._started = False
        self._ready = False
        self._revoked = False
        self._first_error: McpSetupError | None = None
        self._calls: set[trio.CancelScope] = set()
        self._calls_idle = trio.Event()
        self._closed = trio.Event()
        self._revoked_event = trio.Event()

    @property
    def revoked(self) -> bool:
        return self._revoked

    @property
    def tools(self) -> tuple[FrozenTool, ...]:
        """The frozen catalog in server order (empty before ready and after revocation)."""
        return tuple(self._catalog.values())

    async def serve(
        self, *, task_status: trio.TaskStatus[McpRouter] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect every server, freeze the catalog, report ready, and hold the sessions until
        :meth:`revoke`.

        Resource handling: one owning task per server, in a nursery this method owns. On
        revocation, on outside cancellation and on a setup failure, every owning task leaves its
        session normally, which sends the ``DELETE`` ending the server-side session; each exit is
        bounded by :data:`SESSION_CLOSE_TIMEOUT_SECONDS` and shielded from outside cancellation so
        the ``DELETE`` still goes out when the lease is being torn down.

        Error handling: connecting and discovery share one deadline (``setup_timeout``); if any
        server fails, all sessions are closed and :class:`McpSetupError` is raised before
        ``task_status.started`` (so from ``nursery.start``). Nothing is retried. After ready,
        a failing server only fails the calls routed to it.
        """
        if self._started:
            raise RuntimeError("an McpRouter serves once")
        self._started = True
        deadline = trio.current_time() + self._setup_timeout
        error: McpSetupError | None = None
        try:
            async with trio.open_nursery() as nursery:
                try:
                    for conn in self._connections:
                        nursery.start_soon(self._own_session, conn, deadline)
                    for conn in self._connections:
                        await conn.setup_done.wait()
                    error = self._setup_outcome()
                    if error is None:
                        logger.info(
                            "transient MCP ready: %d servers, %d tools",
                            len(self._connections),
                            len(self._catalog),
                        )
                        task_status.started(self)
                        await self._revoked_event.wait()
                finally:
                    # Revocation, outside cancellation or a setup failure: release the owners so
                    # they leave their sessions normally; the nursery then waits for them.
                    self.revoke()
        finally:
            self._closed.set()
        if error is not None:
            # Raised outside the nursery so ``nursery.start`` sees it bare, not in a group.
            logger.warning("transient MCP setup failed: %s", error.message)
            raise error

    def _setup_outcome(self) -> McpSetupError | None:
        if self._first_error is not None:
            return self._first_error
        if self._revoked:
            return McpSetupError("MCP setup was cancelled because the session ended")
        try:
            self._catalog = freeze_catalog([c.tools for c in self._connections])
        except McpSetupError as exc:
            return exc
        self._definition = build_tool_definition(tuple(self._catalog.values()))
        self._ready = True
        return None

    def revoke(self) -> None:
        """Revoke synchronously: in-flight calls are cancelled, every later call fails with
        :data:`REVOKED_MESSAGE`, every session is released for closing, headers are dropped.
        Idempotent. Await :meth:`wait_closed` for the end of the cleanup."""
        if not self._revoked:
            self._revoked = True
            self._revoked_event.set()
            self._catalog = {}
            self._definition = None
            for conn in self._connections:
                if conn.setup_scope is not None:
                    conn.setup_scope.cancel()
                conn.release.set()
                conn.server = None
                conn.secrets = ()
            for scope in self._calls:
                scope.cancel()
        if not self._calls:
            self._calls_idle.set()
        if not self._started:
            self._closed.set()

    async def wait_closed(self) -> None:
        """Return once revoked, every session has been left and every call has finished."""
        await self._revoked_event.wait()
        await self._calls_idle.wait()
        await self._closed.wait()

    def tool_definition(self) -> ExternalToolDefinition:
        """The static ``external_mcp`` tool for this lease's frozen catalog."""
        if self._revoked:
            raise ExternalToolError(REVOKED_MESSAGE)
        if self._definition is None:
            raise RuntimeError("the router is not ready")
        return self._definition

    async def call(
        self, tool_id: str, arguments: Mapping[str, Any], *, call_id: str | None = None
    ) -> dict[str, Any]:
        """Call the frozen tool ``tool_id`` and return its sanitised result as a JSON-ready dict.
        ``call_id`` (the tool call the user sees) is told to a server that lives in the client.

        Raises :class:`ExternalToolError` for an unknown id (before any network traffic), a
        timeout, a server error, an expired server session (never re-initialised or replayed),
        an oversize result, and after revocation. Cancelling the caller cancels the request on
        the server (the SDK sends ``notifications/cancelled``).
        """
        if self._revoked:
            raise ExternalToolError(REVOKED_MESSAGE)
        if not self._ready:
            raise ExternalToolError("External MCP tools are not connected yet")
        tool = self._catalog.get(tool_id) if isinstance(tool_id, str) else None
        if tool is None:
            raise ExternalToolError("unknown external MCP tool id")
        if not isinstance(arguments, Mapping):
            raise ExternalToolError("external MCP tool arguments must be an object")
        conn = self._connections[tool.server_index]
        if conn.session_lost:
            raise _expired(conn)
        session = conn.session
        if session is None:
            raise ExternalToolError(f"{conn.where}: the MCP session has ended")
        failure: Exception | None = None
        result: Any = None
        with trio.CancelScope() as call_scope:
            self._calls.add(call_scope)
            try:
                with trio.move_on_after(self._call_timeout) as timeout_scope:
                    try:
                        meta = tool_call_meta(call_id) if conn.client_side else None
                        result = await session.call_tool(tool.name, dict(arguments), meta=meta)
                    except Exception as exc:
                        failure = exc
            finally:
                self._calls.discard(call_scope)
                if self._revoked and not self._calls:
                    self._calls_idle.set()
        if self._revoked:
            raise ExternalToolError(REVOKED_MESSAGE)
        if timeout_scope.cancelled_caught:
            raise ExternalToolError(
                f"{conn.where}: the tool call timed out after {self._call_timeout:g} seconds"
            )
        if conn.session_lost:
            raise _expired(conn)
        if failure is not None:
            raise ExternalToolError(_describe_call_failure(conn, failure))
        if not isinstance(result, types.CallToolResult):
            raise ExternalToolError(f"{conn.where}: the server sent an unexpected result")
        return sanitise_result(_dump(result))

    async def _own_session(self, conn: _Connection, deadline: float) -> None:
        # Shielded: only revocation (an Event) ends this task, and then it leaves the session
        # normally within its own close deadline.
        with trio.CancelScope(shield=True) as life:
            try:
                async with _open_session(conn, self._channel) as session:
                    try:
                        await self._set_up(conn, session, deadline)
                        if conn.error is None:
                            conn.setup_done.set()
                            await conn.release.wait()
                    finally:
                        conn.session = None
                        life.deadline = trio.current_time() + SESSION_CLOSE_TIMEOUT_SECONDS
            except Exception as exc:  # an ExceptionGroup from the SDK's task groups lands here too
                if not conn.setup_done.is_set() and conn.error is None:
                    self._fail_setup(conn, _describe_setup_failure(conn, exc))
                else:
                    logger.debug("%s: session ended with %s", conn.where, _leaf_name(exc))
            finally:
                conn.session = None
                if not conn.setup_done.is_set() and conn.error is None:
                    self._fail_setup(conn, McpSetupError(f"{conn.where}: setup failed"))
                conn.setup_done.set()
        if life.cancelled_caught:
            logger.warning("%s: closing the MCP session took too long", conn.where)

    async def _set_up(self, conn: _Connection, session: ClientSession, deadline: float) -> None:
        with trio.CancelScope(deadline=deadline) as scope:
            conn.setup_scope = scope
            if self._revoked:
                scope.cancel()
            try:
                if conn.client_side:
                    await client_side_handshake(session, conn.where)
                else:
                    await session.initialize()
                catalog = ServerCatalog(
                    where=conn.where, server_index=conn.index, server_key=conn.key
                )
                cursor: str | None = None
                while True:
                    params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
                    page = await session.list_tools(params=params)
                    raw = [
                        t.model_dump(by_alias=True, mode="json", exclude_none=True)
                        for t in page.tools
                    ]
                    cursor = catalog.add_page(raw, page.next_cursor)
                    if cursor is None:
                        break
                conn.tools = catalog.frozen()
                conn.session = session
            except McpSetupError as exc:
                self._fail_setup(conn, exc)
            except Exception as exc:
                self._fail_setup(conn, _describe_setup_failure(conn, exc))
        conn.setup_scope = None
        if scope.cancelled_caught and conn.error is None:
            if self._revoked:
                conn.error = McpSetupError(f"{conn.where}: setup was cancelled")
            else:
                self._fail_setup(
                    conn,
                    McpSetupError(
                        f"{conn.where}: did not connect and list its tools within "
                        f"{self._setup_timeout:g} seconds"
                    ),
                )

    def _fail_setup(self, conn: _Connection, error: McpSetupError) -> None:
        conn.error = error
        conn.session = None
        if self._first_error is None:
            self._first_error = error
            # One failure fails the whole setup: stop the others now rather than at the deadline.
            for other in self._connections:
                if other is not conn and other.setup_scope is not None:
                    other.setup_scope.cancel()


@asynccontextmanager
async def _open_session(
    conn: _Connection, channel: McpMessageChannel | None
) -> AsyncIterator[ClientSession]:
    """The HTTP client (the only holder of the headers), the transport and the MCP session; for
    a server in the client, the session over the connection's ``mcp/message`` requests."""
    server = conn.server
    if server is None:
        raise McpSetupError(f"{conn.where}: setup was cancelled")
    if server.server_id is not None:
        if channel is None:
            raise McpSetupError(f"{conn.where}: no client connection to reach it through")
        async with client_side_session(channel, server.server_id, _CLIENT_INFO) as session:
            yield session
        return
    stand_in = stand_in_url(server.index)
    http = httpx2.AsyncClient(
        headers=list(server.headers),
        trust_env=False,
        follow_redirects=False,
        max_redirects=0,
        timeout=httpx2.Timeout(
            connect=HTTP_CONNECT_TIMEOUT_SECONDS,
            read=HTTP_READ_TIMEOUT_SECONDS,
            write=HTTP_WRITE_TIMEOUT_SECONDS,
            pool=HTTP_POOL_TIMEOUT_SECONDS,
        ),
        event_hooks={"response": [conn.observe_response]},
        transport=HiddenTargetTransport(
            BoundedTransport(httpx2.AsyncHTTPTransport(trust_env=False)),
            stand_in=stand_in,
            target=server.url,
        ),
    )
    async with (
        http,
        streamable_http_client(
            stand_in, http_client=http, max_sse_event_size=MAX_SSE_EVENT_BYTES
        ) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream, client_info=_CLIENT_INFO) as session,
    ):
        yield session


def _dump(model: pydantic.BaseModel) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def _leaf(exc: BaseException) -> BaseException:
    # Not maple_acp._groups.single_exception: the SDK's task groups can fail with several
    # errors at once (the transport's and its reader's), and the first one names the cause.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _leaf_name(exc: BaseException) -> str:
    return type(_leaf(exc)).__name__


def _expired(conn: _Connection) -> ExternalToolError:
    """The failure of a call to a server that dropped our session; the first one also says so
    to the user (the server's tools stay unavailable for the rest of the session)."""
    notice = None
    if not conn.drop_told:
        conn.drop_told = True
        notice = (
            f"{conn.where} ended its MCP session; its tools are unavailable for the rest of "
            "this session"
        )
    return ExternalToolError(
        f"{conn.where}: the MCP session has expired; the call was not sent again", notice=notice
    )


def _describe_setup_failure(conn: _Connection, exc: BaseException) -> McpSetupError:
    leaf = _leaf(exc)
    if isinstance(leaf, McpSetupError):
        return leaf
    if conn.redirected:
        reason = "the server answered with a redirect, which is not followed"
    elif conn.http_status is not None:
        reason = f"the server answered HTTP {conn.http_status}"
    elif isinstance(leaf, httpx2.TimeoutException):
        reason = "the connection timed out"
    elif isinstance(leaf, httpx2.TransportError):
        reason = "could not connect"
    elif isinstance(leaf, MCPError):
        reason = f"the server refused the MCP handshake (error {leaf.code})"
    elif isinstance(leaf, pydantic.ValidationError):
        reason = "the server sent an invalid MCP message"
    else:
        reason = f"setup failed ({type(leaf).__name__})"
    return McpSetupError(f"{conn.where}: {reason}")


def _describe_call_failure(conn: _Connection, exc: BaseException) -> str:
    leaf = _leaf(exc)
    if isinstance(leaf, MCPError):
        return f"{conn.where}: the server returned error {leaf.code}: {conn.redact(leaf.message)}"
    if conn.redirected:
        return f"{conn.where}: the server answered with a redirect, which is not followed"
    if isinstance(leaf, httpx2.TransportError):
        return f"{conn.where}: the connection to the server failed"
    if isinstance(leaf, pydantic.ValidationError):
        return f"{conn.where}: the server sent an invalid result"
    return f"{conn.where}: the tool call failed ({type(leaf).__name__})"
