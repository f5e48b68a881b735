"""The ASGI application at ``/acp``: both profiles of the ACP network transport.

- **WebSocket** (GET with ``Upgrade``): a new ACP connection per socket; each text message is
  one JSON-RPC message (or a v2 batch) each way; binary messages are ignored. The upgrade
  answer carries ``Acp-Connection-Id``.
- **Streamable HTTP**: ``POST`` of ``initialize`` without ``Acp-Connection-Id`` makes a
  connection and answers ``200`` with the JSON answer and the id; any other ``POST`` goes to its
  connection and is answered ``202`` (its answer comes on a stream); ``GET`` with
  ``Accept: text/event-stream`` opens the connection-scoped stream, or with ``Acp-Session-Id``
  that session's stream (resumable with ``Last-Event-ID``); ``DELETE`` ends the connection.

Every request passes :class:`~maple_acp.net._guard.RequestGuard` first. A connection here is
an ACP connection like a Unix-socket one: the host serves it over a
:class:`~maple_acp.net._channel.NetworkChannel` and counts it in the same connection limit.
Each connection runs in the listener's nursery, not in a request's task: a Streamable HTTP
connection outlives every request it is made of.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final, Protocol

import attrs
import trio

from maple_acp.net._channel import NetworkChannel, parse_message, session_of_params
from maple_acp.net._guard import (
    Refusal,
    RequestGuard,
    bearer_from_header,
    bearer_from_subprotocols,
    chosen_subprotocol,
)
from maple_acp.net._streams import Attachment, EventStream, StreamEnded, StreamGone

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: The one path this listener serves.
ACP_PATH: Final = "/acp"
CONNECTION_HEADER: Final = "acp-connection-id"
SESSION_HEADER: Final = "acp-session-id"
#: Methods whose POST must name its session in ``Acp-Session-Id`` too: the ones every official
#: client sends it with (other session methods may carry it; an answer to our own request
#: never does).
SESSION_HEADER_METHODS: Final = frozenset(
    {
        "session/prompt",
        "session/cancel",
        "session/close",
        "session/set_mode",
        "session/set_config_option",
    }
)
#: An SSE stream with nothing to say sends a comment this often, so proxies keep it open.
SSE_KEEPALIVE_S: Final = 15.0
#: A Streamable HTTP connection with no stream open this long ends like a disconnect.
IDLE_CONNECTION_S: Final = 60.0
#: A session stream's client may come back with ``Last-Event-ID`` within this.
RESUME_WINDOW_S: Final = 30.0
#: ``initialize`` is answered in its POST; a host that does not answer within this is 504.
INITIALIZE_TIMEOUT_S: Final = 30.0
#: A CORS preflight answer may be cached this long by the browser.
PREFLIGHT_MAX_AGE_S: Final = 600

#: Refusals logged at INFO (the first of each address, see ``RefusalLog``); others at DEBUG.
LOGGED_REFUSALS: Final = frozenset({401, 403, 421, 429})

_CORS_ALLOW_HEADERS: Final = (
    "authorization, content-type, accept, acp-connection-id, acp-session-id, last-event-id, "
    "acp-protocol-version"
)
_CORS_EXPOSE_HEADERS: Final = "acp-connection-id, acp-session-id"


class NetworkHost(Protocol):
    """What the listener needs of the ACP service (``maple_acp.edge.AcpService`` is one)."""

    def try_admit(self) -> bool:
        """Take a connection slot (the limit the Unix socket counts in too)."""

    def release(self) -> None:
        """Give a slot taken with :meth:`try_admit` back."""

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one ACP connection over ``stream`` until it ends."""

    async def session_exists(self, session_id: str) -> bool:
        """Whether a session by this id exists for the host's account (open or stored)."""


@attrs.frozen(kw_only=True)
class NetworkLimits:
    #: The connection's outbound credit window: what a stream keeps for a resume.
    keep_lines: int
    keep_bytes: int
    #: The largest POST body or WebSocket message (the inbound frame cap).
    max_message_bytes: int
    keepalive_s: float = SSE_KEEPALIVE_S
    idle_s: float = IDLE_CONNECTION_S
    resume_s: float = RESUME_WINDOW_S
    initialize_timeout_s: float = INITIALIZE_TIMEOUT_S


class BodyTooLarge(Exception):
    pass


@attrs.define(eq=False)
class NetworkConnection:
    id: str
    channel: NetworkChannel
    #: "http" (Streamable HTTP) or "ws".
    kind: str
    #: Since when no stream has been open (``None`` while one is).
    idle_since: float | None = None


def _headers(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        # The first of a repeated header counts; a second Host cannot override the first.
        found.setdefault(key, value.decode("latin-1"))
    return found


def _address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b""
) -> None:
    out = list(headers or [])
    if body:
        out.append((b"content-type", b"application/json"))
    out.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _error_body(text: str) -> bytes:
    # A fixed sentence of ours, never anything the request carried.
    return b'{"error":"' + text.encode() + b'"}'


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise trio.ClosedResourceError("the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


class AcpNetworkApp:
    """See the module docstring. ``nursery`` is the listener's: connections run in it."""

    def __init__(
        self,
        host: NetworkHost,
        guard: RequestGuard,
        nursery: trio.Nursery,
        limits: NetworkLimits,
    ) -> None:
        self._host = host
        self._guard = guard
        self._nursery = nursery
        self._limits = limits
        self.connections: dict[str, NetworkConnection] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- connections ---------------------------------------------------------------------------

    def _new_connection(self, kind: str) -> NetworkConnection:
        channel = NetworkChannel(
            split=kind == "http",
            keep_lines=self._limits.keep_lines,
            keep_bytes=self._limits.keep_bytes,
        )
        connection = NetworkConnection(
            id=secrets.token_urlsafe(18), channel=channel, kind=kind, idle_since=trio.current_time()
        )
        self.connections[connection.id] = connection
        return connection

    async def _run_connection(
        self,
        connection: NetworkConnection,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve one admitted connection; its slot and its id go when it ends."""
        try:
            async with trio.open_nursery() as nursery:
                if connection.kind == "http":
                    nursery.start_soon(self._janitor, connection)
                task_status.started()
                try:
                    await self._host.serve_stream(connection.channel)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._host.release()
            connection.channel.close()
            self.connections.pop(connection.id, None)

    async def _janitor(self, connection: NetworkConnection) -> None:
        """Ends a Streamable HTTP connection left with no stream for the idle bound, and
        expires session streams left without a receiver past the resume window."""
        channel = connection.channel
        limits = self._limits
        while not channel.closed:
            changed = channel.streams_changed
            now = trio.current_time()
            deadline = float("inf")
            if channel.attached_streams() == 0:
                if connection.idle_since is None:
                    connection.idle_since = now
                if now >= connection.idle_since + limits.idle_s:
                    logger.info(
                        "ending a network connection with no stream open for %.0f s",
                        limits.idle_s,
                    )
                    channel.finish_input()
                    return
                deadline = connection.idle_since + limits.idle_s
            else:
                connection.idle_since = None
            for session_id, stream in list(channel.sessions.items()):
                if stream.receiver is None and stream.detached_at is not None:
                    expires = stream.detached_at + limits.resume_s
                    if now >= expires:
                        channel.expire(session_id)
                    else:
                        deadline = min(deadline, expires)
            with trio.move_on_at(deadline):
                await changed.wait()

    # -- HTTP ----------------------------------------------------------------------------------

    def _cors(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        if not self._guard.origin_allowed(origin):
            return []
        assert origin is not None
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-expose-headers", _CORS_EXPOSE_HEADERS.encode()),
            (b"vary", b"origin"),
        ]

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        origin = headers.get("origin")
        method = scope.get("method", "")
        refusal = self._guard.check_host(headers.get("host")) or self._guard.check_origin(origin)
        if refusal is None and method == "OPTIONS":
            await self._preflight(origin, send)
            return
        if refusal is None:
            token = bearer_from_header(headers.get("authorization"))
            refusal = self._guard.check_token(_address(scope), token)
        if refusal is not None:
            await self._refuse(refusal, scope, send, self._cors(origin))
            return
        cors = self._cors(origin)
        if scope.get("path") != ACP_PATH:
            await _respond(send, 404, cors)
        elif method == "POST":
            await self._post(headers, receive, send, cors)
        elif method == "GET":
            await self._get(headers, receive, send, cors)
        elif method == "DELETE":
            await self._delete(headers, send, cors)
        else:
            await _respond(send, 405, [*cors, (b"allow", b"GET, POST, DELETE, OPTIONS")])

    async def _refuse(
        self, refusal: Refusal, scope: Scope, send: Send, cors: list[tuple[bytes, bytes]]
    ) -> None:
        self._log_refusal(refusal, scope, "request")
        extra = [(b"www-authenticate", b"Bearer")] if refusal.status == 401 else []
        await _respond(send, refusal.status, [*cors, *extra])

    def _log_refusal(self, refusal: Refusal, scope: Scope, what: str) -> None:
        """One INFO line for the first refusal of an address with a status, DEBUG for its
        repeats (counted, then reported in one INFO line): a flood does not fill the log."""
        address = _address(scope)
        level = logging.DEBUG
        if refusal.status in LOGGED_REFUSALS:
            first, ended = self._guard.refusals.note(address, refusal.status)
            for repeats in ended:
                logger.info(
                    "...and %d more %d refusals from %s in the %.0f s after its first",
                    repeats.count,
                    repeats.status,
                    repeats.address,
                    repeats.seconds,
                )
            level = logging.INFO if first else logging.DEBUG
        logger.log(
            level, "refused a %s from %s (%d): %s", what, address, refusal.status, refusal.reason
        )

    async def _preflight(self, origin: str | None, send: Send) -> None:
        if origin is None:
            # Not a browser's preflight: nothing here answers OPTIONS otherwise.
            await _respond(send, 405, [(b"allow", b"GET, POST, DELETE, OPTIONS")])
            return
        await _respond(
            send,
            204,
            [
                *self._cors(origin),
                (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                (b"access-control-allow-headers", _CORS_ALLOW_HEADERS.encode()),
                (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
            ],
        )

    def _connection(self, headers: dict[str, str]) -> NetworkConnection | None:
        connection = self.connections.get(headers.get(CONNECTION_HEADER, ""))
        if connection is None or connection.kind != "http" or connection.channel.closed:
            return None
        return connection

    async def _post(
        self,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        cors: list[tuple[bytes, bytes]],
    ) -> None:
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            await _respond(send, 415, cors, _error_body("Content-Type must be application/json"))
            return
        try:
            body = await _read_body(receive, self._limits.max_message_bytes)
        except BodyTooLarge:
            await _respond(send, 413, cors, _error_body("the message is too large"))
            return
        except trio.ClosedResourceError:
            return  # the client went away while sending: nobody to answer
        try:
            message = parse_message(body)
        except ValueError:
            await _respond(send, 400, cors, _error_body("the body is not JSON"))
            return
        if isinstance(message, list):
            await _respond(send, 501, cors, _error_body("batches are not served over HTTP"))
            return
        if not isinstance(message, dict):
            await _respond(send, 400, cors, _error_body("the body is not a JSON-RPC message"))
            return
        if CONNECTION_HEADER not in headers:
            # Its answer is found by its id: a string or an integer, as JSON-RPC allows.
            if message.get("method") == "initialize" and type(message.get("id")) in (int, str):
                await self._initialize(body, message, send, cors)
            else:
                await _respond(send, 400, cors, _error_body("Acp-Connection-Id is missing"))
            return
        connection = self._connection(headers)
        if connection is None:
            await _respond(send, 404, cors, _error_body("no such connection"))
            return
        method = message.get("method")
        in_params = session_of_params(message)
        if method in SESSION_HEADER_METHODS and in_params is not None and in_params.strip():
            # A blank or missing session id is the JSON-RPC layer's to refuse (-32602).
            named = headers.get(SESSION_HEADER)
            if named is None or named.strip() != in_params.strip():
                await _respond(
                    send, 400, cors, _error_body("Acp-Session-Id must name the message's session")
                )
                return
        try:
            await connection.channel.deliver(body, message)
        except trio.ClosedResourceError:
            await _respond(send, 404, cors, _error_body("no such connection"))
            return
        await _respond(send, 202, cors)

    async def _initialize(
        self, body: bytes, message: dict[str, Any], send: Send, cors: list[tuple[bytes, bytes]]
    ) -> None:
        if not self._host.try_admit():
            logger.warning("refusing a network ACP connection: every connection slot is in use")
            await _respond(send, 503, cors, _error_body("too many connections"))
            return
        connection = self._new_connection("http")
        answer: list[bytes] = []
        answered = trio.Event()

        def take(line: bytes) -> None:
            answer.append(line)
            answered.set()

        connection.channel.capture(message.get("id"), take)
        await self._nursery.start(self._run_connection, connection)
        with contextlib.suppress(trio.ClosedResourceError):
            await connection.channel.deliver(body, message)
        with trio.move_on_after(self._limits.initialize_timeout_s):
            await _first_of(answered.wait, connection.channel.wait_closed)
        if not answer:
            connection.channel.close()
            await _respond(send, 504, cors, _error_body("initialize was not answered"))
            return
        logger.info("network ACP connection opened (Streamable HTTP)")
        await _respond(
            send, 200, [*cors, (CONNECTION_HEADER.encode(), connection.id.encode())], answer[0]
        )

    async def _get(
        self,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        cors: list[tuple[bytes, bytes]],
    ) -> None:
        if "text/event-stream" not in headers.get("accept", ""):
            await _respond(send, 406, cors, _error_body("Accept must include text/event-stream"))
            return
        if CONNECTION_HEADER not in headers:
            await _respond(send, 400, cors, _error_body("Acp-Connection-Id is missing"))
            return
        connection = self._connection(headers)
        if connection is None:
            await _respond(send, 404, cors, _error_body("no such connection"))
            return
        last_event_id: int | None = None
        if "last-event-id" in headers:
            try:
                last_event_id = int(headers["last-event-id"].strip())
            except ValueError:
                await _respond(send, 400, cors, _error_body("Last-Event-ID is not an event id"))
                return
        channel = connection.channel
        session_id = headers.get(SESSION_HEADER)
        stream: EventStream
        if session_id is None:
            stream = channel.main
        else:
            existing = channel.sessions.get(session_id)
            if existing is None:
                if last_event_id is not None:
                    await _respond(send, 410, cors, _error_body("the stream is gone; reload"))
                    return
                if not await self._host.session_exists(session_id) or channel.closed:
                    await _respond(send, 404, cors, _error_body("no such session"))
                    return
                existing = channel.stream_for(session_id)
            stream = existing
        try:
            attachment = stream.attach(last_event_id)
        except StreamGone:
            await _respond(send, 410, cors, _error_body("the stream is gone; reload"))
            return
        channel.note_streams_changed()
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        *cors,
                        (b"content-type", b"text/event-stream"),
                        (b"cache-control", b"no-store"),
                        (b"x-accel-buffering", b"no"),
                    ],
                }
            )
            await self._pump_sse(attachment, receive, send)
        finally:
            attachment.detach()
            channel.note_streams_changed()

    async def _pump_sse(self, attachment: Attachment, receive: Receive, send: Send) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
            keepalive = self._limits.keepalive_s
            while True:
                try:
                    batch = await attachment.next_batch(idle_after=keepalive)
                except StreamEnded:
                    break
                if batch is None:
                    body = b": keepalive\n\n"
                else:
                    body = b"".join(
                        b"id: %d\ndata: %s\n\n" % (event_id, _ascii(line))
                        for event_id, line in batch
                    )
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if batch:
                    attachment.written(batch)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()

    async def _delete(
        self, headers: dict[str, str], send: Send, cors: list[tuple[bytes, bytes]]
    ) -> None:
        if CONNECTION_HEADER not in headers:
            await _respond(send, 400, cors, _error_body("Acp-Connection-Id is missing"))
            return
        connection = self._connection(headers)
        if connection is None:
            await _respond(send, 404, cors, _error_body("no such connection"))
            return
        connection.channel.finish_input()
        await _respond(send, 202, cors)

    # -- WebSocket -----------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        headers = _headers(scope)
        offered = [str(p) for p in scope.get("subprotocols", ())]
        refusal = self._guard.check_host(headers.get("host")) or self._guard.check_origin(
            headers.get("origin")
        )
        if refusal is None:
            token = bearer_from_header(headers.get("authorization"))
            if token is None:
                token = bearer_from_subprotocols(offered)
            refusal = self._guard.check_token(_address(scope), token)
        if refusal is None and scope.get("path") != ACP_PATH:
            refusal = Refusal(404, "a path other than /acp")
        if refusal is None and not self._host.try_admit():
            logger.warning("refusing a network ACP connection: every connection slot is in use")
            refusal = Refusal(503, "every connection slot is in use")
        if refusal is not None:
            await self._refuse_upgrade(refusal, scope, send)
            return
        connection = self._new_connection("ws")
        await self._nursery.start(self._run_connection, connection)
        channel = connection.channel
        await send(
            {
                "type": "websocket.accept",
                "subprotocol": chosen_subprotocol(offered),
                "headers": [(CONNECTION_HEADER.encode(), connection.id.encode())],
            }
        )
        logger.info("network ACP connection opened (WebSocket)")
        attachment = channel.main.attach()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_websocket, attachment, send, nursery.cancel_scope)
                while True:
                    message = await receive()
                    if message["type"] != "websocket.receive":
                        break
                    text = message.get("text")
                    if text is None:
                        continue  # binary messages carry nothing in this protocol
                    try:
                        await channel.deliver(text.encode())
                    except trio.ClosedResourceError:
                        break
                nursery.cancel_scope.cancel()
        finally:
            attachment.detach()
            channel.finish_input()

    async def _refuse_upgrade(self, refusal: Refusal, scope: Scope, send: Send) -> None:
        self._log_refusal(refusal, scope, "WebSocket")
        if "websocket.http.response" in scope.get("extensions", {}):
            extra = [(b"www-authenticate", b"Bearer")] if refusal.status == 401 else []
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": refusal.status,
                    "headers": [*extra, (b"content-length", b"0")],
                }
            )
            await send({"type": "websocket.http.response.body", "body": b""})
        else:
            await send({"type": "websocket.close"})


def _ascii(line: bytes) -> bytes:
    """``line`` with every non-ASCII character as a ``\\u`` escape: the same JSON value. A
    client that decodes each chunk it reads as UTF-8 on its own (the official Python SDK's
    SSE reader does) would otherwise fail on a character cut between two reads and lose the
    stream."""
    if line.isascii():
        return line
    try:
        value = parse_message(line)
    except ValueError:
        return line
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode()


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Until the first of ``waits`` returns."""
    async with trio.open_nursery() as nursery:

        async def wait(one: Callable[[], Awaitable[object]]) -> None:
            await one()
            nursery.cancel_scope.cancel()

        for one in waits:
            nursery.start_soon(wait, one)


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] in ("http.disconnect", "websocket.disconnect"):
            scope.cancel()
            return


async def _send_websocket(attachment: Attachment, send: Send, scope: trio.CancelScope) -> None:
    """The WebSocket's writer: one text message per JSON-RPC line, in order."""
    try:
        while True:
            try:
                batch = await attachment.next_batch(idle_after=float("inf"))
            except StreamEnded:
                break
            if batch is None:
                continue
            for _, line in batch:
                await send({"type": "websocket.send", "text": line.decode()})
            attachment.written(batch)
        await send({"type": "websocket.close", "code": 1000})
    finally:
        scope.cancel()
