"""The Streamable HTTP profile of the ACP network transport (``POST``, ``GET``, ``DELETE`` and
a browser's ``OPTIONS`` at ``/acp``).

``POST`` of ``initialize`` without ``Acp-Connection-Id`` makes a connection and answers
``200`` with the JSON answer and the id; any other ``POST`` goes to its connection and is
answered ``202`` (its answer comes on a stream); ``GET`` with ``Accept: text/event-stream``
opens the connection-scoped stream, or with ``Acp-Session-Id`` that session's stream
(resumable with ``Last-Event-ID``); ``DELETE`` ends the connection. Every request passes
:class:`~maple_acp.net._guard.RequestGuard` first; answers carry CORS headers for an allowed
``Origin``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from json.encoder import encode_basestring_ascii
from typing import Any, Final

import orjson
import trio

from maple_acp.net._asgi import (
    ACP_PATH,
    CONNECTION_HEADER,
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    address_of,
    error_body,
    headers_of,
    log_refusal,
    read_body,
    respond,
    until_disconnect,
)
from maple_acp.net._channel import AnswerCapture
from maple_acp.net._connections import ConnectionTable, NetworkConnection
from maple_acp.net._guard import Refusal, RequestGuard, bearer_from_header
from maple_acp.net._streams import Attachment, EventStream, StreamEnded, StreamGone
from maple_acp.rpc import Request, parse_message

logger = logging.getLogger(__name__)

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
#: Written as soon as an event stream opens: a proxy that holds the response headers until the
#: first body byte (nginx over HTTP/2 does) passes the stream on at once, not at the keepalive.
STREAM_OPENED: Final = b": open\n\n"
#: A CORS preflight answer may be cached this long by the browser.
PREFLIGHT_MAX_AGE_S: Final = 600

_CORS_ALLOW_HEADERS: Final = (
    "authorization, content-type, accept, acp-connection-id, acp-session-id, last-event-id, "
    "acp-protocol-version"
)
_CORS_EXPOSE_HEADERS: Final = "acp-connection-id, acp-session-id"


class StreamableHttpProfile:
    """Serves one ASGI ``http`` scope: a request of the Streamable HTTP profile."""

    def __init__(self, guard: RequestGuard, connections: ConnectionTable) -> None:
        self._guard = guard
        self._connections = connections
        self._limits = connections.limits

    def _cors(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        """The CORS headers of an answer to an allowed origin (none for any other). Browsers
        send the page's credentials by default (the official TypeScript client does), and
        read no answer to such a request without ``Allow-Credentials``."""
        if not self._guard.origin_allowed(origin):
            return []
        assert origin is not None
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-allow-credentials", b"true"),
            (b"access-control-expose-headers", _CORS_EXPOSE_HEADERS.encode()),
            (b"vary", b"origin"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = headers_of(scope)
        origin = headers.get("origin")
        method = scope.get("method", "")
        refusal = self._guard.check_host(headers.get("host")) or self._guard.check_origin(origin)
        if refusal is None and method == "OPTIONS":
            await self._preflight(origin, headers, send)
            return
        if refusal is None:
            token = bearer_from_header(headers.get("authorization"))
            refusal = self._guard.check_token(address_of(scope), token)
        # The token generation this request was admitted under: read in the same step as the
        # check (a connection it makes is ended when that token is no longer in force).
        generation = self._connections.generation()
        if refusal is not None:
            await self._refuse(refusal, scope, send, self._cors(origin))
            return
        cors = self._cors(origin)
        if scope.get("path") != ACP_PATH:
            await respond(send, 404, cors)
        elif method == "POST":
            await self._post(headers, receive, send, cors, generation)
        elif method == "GET":
            await self._get(headers, receive, send, cors)
        elif method == "DELETE":
            await self._delete(headers, send, cors)
        else:
            await respond(send, 405, [*cors, (b"allow", b"GET, POST, DELETE, OPTIONS")])

    async def _refuse(
        self, refusal: Refusal, scope: Scope, send: Send, cors: list[tuple[bytes, bytes]]
    ) -> None:
        log_refusal(self._guard, refusal, scope, "request")
        extra = [(b"www-authenticate", b"Bearer")] if refusal.status == 401 else []
        await respond(send, refusal.status, [*cors, *extra])

    async def _preflight(self, origin: str | None, headers: dict[str, str], send: Send) -> None:
        """A browser's preflight from an allowed origin (the guard refused any other). A page
        on a public site asks ``Request-Private-Network`` before it may reach a loopback or
        private address; the browser then asks its user too."""
        if origin is None:
            # Not a browser's preflight: nothing here answers OPTIONS otherwise.
            await respond(send, 405, [(b"allow", b"GET, POST, DELETE, OPTIONS")])
            return
        answer = [
            *self._cors(origin),
            (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
            (b"access-control-allow-headers", _CORS_ALLOW_HEADERS.encode()),
            (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
        ]
        private = headers.get("access-control-request-private-network", "")
        if private.strip().lower() == "true":
            answer.append((b"access-control-allow-private-network", b"true"))
        await respond(send, 204, answer)

    def _connection(self, headers: dict[str, str]) -> NetworkConnection | None:
        connection = self._connections.by_id.get(headers.get(CONNECTION_HEADER, ""))
        if connection is None or connection.kind != "http" or connection.channel.closed:
            return None
        return connection

    async def _post(
        self,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        cors: list[tuple[bytes, bytes]],
        generation: int,
    ) -> None:
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            await respond(send, 415, cors, error_body("Content-Type must be application/json"))
            return
        try:
            body = await read_body(receive, self._limits.max_message_bytes)
        except BodyTooLarge:
            await respond(send, 413, cors, error_body("the message is too large"))
            return
        except trio.ClosedResourceError:
            return  # the client went away while sending: nobody to answer
        try:
            # Read for its method and session only: the connection's peer reads it exactly.
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            await respond(send, 400, cors, error_body("the body is not JSON"))
            return
        if isinstance(message, list):
            await respond(send, 501, cors, error_body("batches are not served over HTTP"))
            return
        if not isinstance(message, dict):
            await respond(send, 400, cors, error_body("the body is not a JSON-RPC message"))
            return
        if CONNECTION_HEADER not in headers:
            # It must be a request to be answered: an id that is a string or an integer (of
            # any size: the peer's own reading tells, as orjson reads a long one as a float).
            if message.get("method") == "initialize" and _is_request(body):
                await self._initialize(body, send, cors, generation)
            else:
                await respond(send, 400, cors, error_body("Acp-Connection-Id is missing"))
            return
        connection = self._connection(headers)
        if connection is None:
            await respond(send, 404, cors, error_body("no such connection"))
            return
        method = message.get("method")
        in_params = _session_of_params(message)
        if method in SESSION_HEADER_METHODS and in_params is not None and in_params.strip():
            # A blank or missing session id is the JSON-RPC layer's to refuse (-32602).
            named = headers.get(SESSION_HEADER)
            if named is None or named.strip() != in_params.strip():
                await respond(
                    send, 400, cors, error_body("Acp-Session-Id must name the message's session")
                )
                return
        try:
            # Its answer goes where its session's messages go.
            await connection.channel.deliver(body, in_params if "id" in message else None)
        except trio.ClosedResourceError:
            await respond(send, 404, cors, error_body("no such connection"))
            return
        await respond(send, 202, cors)

    async def _initialize(
        self, body: bytes, send: Send, cors: list[tuple[bytes, bytes]], generation: int
    ) -> None:
        if not self._connections.host.try_admit():
            logger.warning("refusing a network ACP connection: every connection slot is in use")
            await respond(send, 503, cors, error_body("too many connections"))
            return
        connection = self._connections.new("http", generation)
        answer: list[bytes] = []
        answered = trio.Event()

        def take(line: bytes) -> None:
            answer.append(line)
            answered.set()

        await self._connections.start(connection)
        with contextlib.suppress(trio.ClosedResourceError):
            await connection.channel.deliver(body, AnswerCapture(take))
        with trio.move_on_after(self._limits.initialize_timeout_s):
            await _first_of(answered.wait, connection.channel.wait_closed)
        if not answer:
            connection.channel.close()
            await respond(send, 504, cors, error_body("initialize was not answered"))
            return
        logger.info("network ACP connection opened (Streamable HTTP)")
        await respond(
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
            await respond(send, 406, cors, error_body("Accept must include text/event-stream"))
            return
        if CONNECTION_HEADER not in headers:
            await respond(send, 400, cors, error_body("Acp-Connection-Id is missing"))
            return
        connection = self._connection(headers)
        if connection is None:
            await respond(send, 404, cors, error_body("no such connection"))
            return
        last_event_id: int | None = None
        if "last-event-id" in headers:
            try:
                last_event_id = int(headers["last-event-id"].strip())
            except ValueError:
                await respond(send, 400, cors, error_body("Last-Event-ID is not an event id"))
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
                    await respond(send, 410, cors, error_body("the stream is gone; reload"))
                    return
                if not await self._connections.host.session_exists(session_id) or channel.closed:
                    await respond(send, 404, cors, error_body("no such session"))
                    return
                existing = channel.stream_for(session_id)
            stream = existing
        try:
            attachment = stream.attach(last_event_id)
        except StreamGone:
            await respond(send, 410, cors, error_body("the stream is gone; reload"))
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
            nursery.start_soon(until_disconnect, receive, nursery.cancel_scope)
            await send({"type": "http.response.body", "body": STREAM_OPENED, "more_body": True})
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
            await respond(send, 400, cors, error_body("Acp-Connection-Id is missing"))
            return
        connection = self._connection(headers)
        if connection is None:
            await respond(send, 404, cors, error_body("no such connection"))
            return
        connection.channel.finish_input()
        await respond(send, 202, cors)


def _session_of_params(message: dict[str, Any]) -> str | None:
    params = message.get("params")
    if isinstance(params, dict):
        session_id = params.get("sessionId")
        if isinstance(session_id, str):
            return session_id
    return None


def _is_request(body: bytes) -> bool:
    """Whether ``body`` is a request the peer will answer (an id that is a string or an
    integer), as the peer reads it."""
    parsed = parse_message(body)
    return isinstance(parsed, Request) and type(parsed.id) in (int, str)


#: A byte of a UTF-8 sequence for a character beyond ASCII.
_NON_ASCII: Final = re.compile(rb"[\x80-\xff]")


def _ascii(line: bytes) -> bytes:
    """``line`` with every non-ASCII character as a ``\\u`` escape: the same JSON value. A
    client that decodes each chunk it reads as UTF-8 on its own (the official Python SDK's
    SSE reader does) would otherwise fail on a character cut between two reads and lose the
    stream.

    No parse: in JSON text a byte past ASCII occurs only inside a string, where the escape of
    its character means that character. The span from the first such byte to the last is
    escaped as a JSON string would be, and its quotes and backslashes (the only other
    characters that escaping touches in JSON text, which holds no raw control characters)
    are put back as they were."""
    if line.isascii():
        return line
    first = _NON_ASCII.search(line)
    last = _NON_ASCII.search(line[::-1])
    if first is None or last is None:
        return line
    start, end = first.start(), len(line) - last.start()
    escaped = encode_basestring_ascii(line[start:end].decode(errors="surrogateescape"))[1:-1]
    # A NUL never survives the escaping, so it can stand for a backslash meanwhile.
    escaped = escaped.replace("\\\\", "\0").replace('\\"', '"').replace("\0", "\\")
    return line[:start] + escaped.encode() + line[end:]


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Until the first of ``waits`` returns."""
    async with trio.open_nursery() as nursery:

        async def wait(one: Callable[[], Awaitable[object]]) -> None:
            await one()
            nursery.cancel_scope.cancel()

        for one in waits:
            nursery.start_soon(wait, one)
