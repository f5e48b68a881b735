"""MCP over ACP: the streams of an MCP client session whose other end is the ACP connection.

A server that lives in the client (``{"type": "acp", "serverId", "name"}``) has no socket of
its own: the host speaks MCP to it by sending ``mcp/message`` requests to the client on the
connection that declared it. The router does not change for it. It runs the same MCP client
session as for an HTTP server, over a pair of in-memory streams (what the SDK's transports
give it), and :func:`client_side_streams` forwards what the session writes:

- an inner request becomes one ``mcp/message`` request in the schema's flat shape
  (``serverId``, ``requestId``, ``method``, ``params``) with ``_meta["maple.sessionId"]``,
  plus ``_meta["maple.toolCallId"]`` for a tool call; the client's answer (``{result}`` or
  ``{error}``, the inner outcome) goes back to the session as the inner response;
- ``notifications/cancelled`` abandons the forwarded request (the edge then tells the client
  with ``$/cancel_request``);
- every other inner notification (``notifications/initialized`` among them) is not sent: the
  schema has no host-to-client shape for one.

The session opens with the ``initialize`` handshake; a server that refuses it with an inner
error is asked ``server/discover`` once (:func:`client_side_handshake`): the ACP SDKs' own
providers of client-side servers speak only the stateless MCP revision, which has no
handshake and carries its version in every request's ``_meta``.

Resource handling: one task per forwarded request, in a nursery the context manager owns and
cancels when the session is left. Error handling: a client that fails the outer request,
answers with neither outcome, or stays silent past :data:`REQUEST_TIMEOUT_SECONDS` gives the
session an inner error naming that, never an exception; the router's own deadlines (setup,
call) decide what the user sees.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Protocol, cast

import anyio
import pydantic
import trio
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    DiscoverResult,
    ErrorData,
    Implementation,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
    RequestParamsMeta,
)
from mcp.types.version import LATEST_MODERN_VERSION

from maple_acp._text import one_line
from maple_acp.mcp._errors import McpSetupError

logger = logging.getLogger(__name__)

#: The ACP method that carries an inner MCP message.
MCP_MESSAGE_METHOD: Final = "mcp/message"
#: ``_meta`` key naming the session a request was sent for (always present).
SESSION_ID_META: Final = "maple.sessionId"
#: ``_meta`` key naming the tool call a request was sent for (tool calls only). The router puts
#: it in the inner request's ``_meta`` and the forwarder moves it to the outer one.
TOOL_CALL_ID_META: Final = "maple.toolCallId"
#: One forwarded request, as for a transient HTTP server's request timeout (docs/limits.md).
REQUEST_TIMEOUT_SECONDS: Final = 30.0
#: Messages waiting each way between the session and the forwarder; the session's own writes
#: wait beyond it, so memory stays bounded.
STREAM_BUFFER: Final = 16
#: A client's own error text quoted back in a set-up failure.
MAX_QUOTED_CLIENT_TEXT: Final = 200
#: Inner error codes the forwarder answers with itself (JSON-RPC's "internal error" and the MCP
#: SDK's request timeout): the client failed the outer request, or never answered it.
CLIENT_FAILED_CODE: Final = -32603
CLIENT_SILENT_CODE: Final = -32001


class McpMessageChannel(Protocol):
    """The connection that declared the client's servers, for one session (the edge's)."""

    @property
    def session_id(self) -> str:
        """The session the requests are sent for (the id its open's answer carries)."""
        ...

    async def request(self, params: Mapping[str, Any]) -> Any:
        """Send ``mcp/message`` with ``params`` and return the client's answer as it came.
        Raises if the client answers with an outer error or the connection ends; the
        exception's ``str`` is one safe line. Cancelling it withdraws the request."""
        ...


def tool_call_meta(call_id: str | None) -> RequestParamsMeta | None:
    """The inner ``_meta`` that tells the forwarder which tool call a ``tools/call`` is for."""
    return None if not call_id else cast(RequestParamsMeta, {TOOL_CALL_ID_META: call_id})


async def client_side_handshake(session: ClientSession, where: str) -> None:
    """Open the MCP session with a server in the client: ``initialize``, or, when the server
    refuses it, ``server/discover`` at the stateless revision (adopted if the server offers it).
    If both fail, :class:`McpSetupError` says how the handshake was refused (``where`` names
    the server): the words are the client's own, going back to it."""
    try:
        await session.initialize()
    except MCPError as refused:
        try:
            found = DiscoverResult.model_validate(
                await session.send_discover(LATEST_MODERN_VERSION)
            )
            session.adopt(found)
        except (MCPError, pydantic.ValidationError, RuntimeError):
            reason = one_line(refused.message, limit=MAX_QUOTED_CLIENT_TEXT)
            raise McpSetupError(
                f"{where}: the client refused the MCP handshake (error {refused.code}: {reason})"
            ) from None
        logger.debug("client-side MCP server speaks %s", LATEST_MODERN_VERSION)


@asynccontextmanager
async def client_side_session(
    channel: McpMessageChannel, server_id: str, client_info: Implementation
) -> AsyncIterator[ClientSession]:
    """An MCP client session with the client's server ``server_id``, not yet initialised."""
    async with (
        client_side_streams(channel, server_id) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream, client_info=client_info) as session,
    ):
        yield session


@asynccontextmanager
async def client_side_streams(
    channel: McpMessageChannel, server_id: str
) -> AsyncIterator[
    tuple[
        anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
        anyio.abc.ObjectSendStream[SessionMessage],
    ]
]:
    """The read and write streams of an MCP client session with the client's ``server_id``."""
    to_client, from_session = anyio.create_memory_object_stream[SessionMessage](STREAM_BUFFER)
    to_session, from_client = anyio.create_memory_object_stream[SessionMessage | Exception](
        STREAM_BUFFER
    )
    forwarder = _Forwarder(channel, server_id, to_session)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(forwarder.run, from_session, nursery)
        try:
            yield from_client, to_client
        finally:
            nursery.cancel_scope.cancel()
            to_client.close()
            from_client.close()
            to_session.close()


class _Forwarder:
    def __init__(
        self,
        channel: McpMessageChannel,
        server_id: str,
        to_session: anyio.abc.ObjectSendStream[SessionMessage | Exception],
    ) -> None:
        self._channel = channel
        self._server_id = server_id
        self._to_session = to_session
        #: Forwarded requests by inner id, so a ``notifications/cancelled`` can withdraw one.
        self._active: dict[RequestId, trio.CancelScope] = {}

    async def run(
        self, from_session: anyio.abc.ObjectReceiveStream[SessionMessage], nursery: trio.Nursery
    ) -> None:
        async with from_session:
            async for item in from_session:
                message = item.message
                if isinstance(message, JSONRPCRequest):
                    scope = trio.CancelScope()
                    self._active[message.id] = scope
                    nursery.start_soon(self._forward, message, scope)
                elif isinstance(message, JSONRPCNotification):
                    if message.method == "notifications/cancelled":
                        self._withdraw(message.params)
                    else:
                        logger.debug("inner %s not sent: ACP has no shape for it", message.method)

    def _withdraw(self, params: Mapping[str, Any] | None) -> None:
        request_id = params.get("requestId") if params is not None else None
        scope = self._active.get(request_id) if isinstance(request_id, int | str) else None
        if scope is not None:
            scope.cancel()

    async def _forward(self, request: JSONRPCRequest, scope: trio.CancelScope) -> None:
        try:
            with scope:
                outcome = await self._ask(request)
        finally:
            self._active.pop(request.id, None)
        if scope.cancelled_caught:
            return  # the session abandoned it: nobody waits for an answer
        try:
            await self._to_session.send(SessionMessage(message=outcome))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            logger.debug("answer to inner request %r dropped: the session ended", request.id)

    async def _ask(self, request: JSONRPCRequest) -> JSONRPCResponse | JSONRPCError:
        params, tool_call_id = _split_tool_call(request.params)
        meta = {SESSION_ID_META: self._channel.session_id}
        if tool_call_id is not None:
            meta[TOOL_CALL_ID_META] = tool_call_id
        outer: dict[str, Any] = {
            "serverId": self._server_id,
            "requestId": str(request.id),
            "method": request.method,
        }
        if params is not None:
            outer["params"] = params
        outer["_meta"] = meta
        answer: Any = None
        with trio.move_on_after(REQUEST_TIMEOUT_SECONDS) as silence:
            try:
                answer = await self._channel.request(outer)
            except trio.Cancelled:
                raise
            except Exception as exc:
                reason = one_line(str(exc) or type(exc).__name__, limit=200)
                return _error(request.id, CLIENT_FAILED_CODE, f"the client failed it: {reason}")
        if silence.cancelled_caught:
            return _error(
                request.id,
                CLIENT_SILENT_CODE,
                f"the client did not answer within {REQUEST_TIMEOUT_SECONDS:g} seconds",
            )
        return _inner_outcome(request.id, answer)


def _split_tool_call(
    params: Mapping[str, Any] | None,
) -> tuple[dict[str, Any] | None, str | None]:
    """The inner params without the router's tool call marker, and the tool call id."""
    if params is None:
        return None, None
    out = dict(params)
    inner_meta = out.get("_meta")
    if not isinstance(inner_meta, Mapping) or TOOL_CALL_ID_META not in inner_meta:
        return out, None
    rest = {k: v for k, v in inner_meta.items() if k != TOOL_CALL_ID_META}
    if rest:
        out["_meta"] = rest
    else:
        del out["_meta"]
    tool_call_id = inner_meta[TOOL_CALL_ID_META]
    return out, tool_call_id if isinstance(tool_call_id, str) else None


def _inner_outcome(request_id: RequestId, answer: Any) -> JSONRPCResponse | JSONRPCError:
    """The client's answer as the inner response: ``result`` wins over ``error`` (the schema's
    rule); anything else is an inner error."""
    if isinstance(answer, Mapping):
        if "result" in answer:
            result = answer["result"]
            if isinstance(result, dict):
                return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
            return _error(
                request_id, CLIENT_FAILED_CODE, "the client's MCP result is not an object"
            )
        error = answer.get("error")
        if isinstance(error, Mapping):
            code, message = error.get("code"), error.get("message")
            if isinstance(code, int) and not isinstance(code, bool) and isinstance(message, str):
                data = ErrorData(code=code, message=message, data=error.get("data"))
                return JSONRPCError(jsonrpc="2.0", id=request_id, error=data)
    return _error(
        request_id, CLIENT_FAILED_CODE, "the client answered mcp/message with neither outcome"
    )


def _error(request_id: RequestId, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))
