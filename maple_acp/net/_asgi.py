"""The ASGI plumbing both profiles of the network transport share: the callable's types, the
request's headers and address, a whole answer, a bounded body, a disconnect watch, and the
log line of a refusal. Nothing here knows a profile's rules.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import trio

from maple_acp.net._guard import Refusal, RequestGuard, shown

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: The one path this listener serves.
ACP_PATH: Final = "/acp"
CONNECTION_HEADER: Final = "acp-connection-id"

#: Refusals logged at INFO (the first of each address, see ``RefusalLog``); others at DEBUG.
LOGGED_REFUSALS: Final = frozenset({401, 403, 421, 429})


class BodyTooLarge(Exception):
    pass


def headers_of(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        # The first of a repeated header counts; a second Host cannot override the first.
        found.setdefault(key, value.decode("latin-1"))
    return found


def address_of(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b""
) -> None:
    out = list(headers or [])
    if body:
        out.append((b"content-type", b"application/json"))
    out.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def error_body(text: str) -> bytes:
    # A fixed sentence of ours, never anything the request carried.
    return b'{"error":"' + text.encode() + b'"}'


async def read_body(receive: Receive, limit: int) -> bytes:
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


async def until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] in ("http.disconnect", "websocket.disconnect"):
            scope.cancel()
            return


def log_refusal(guard: RequestGuard, refusal: Refusal, scope: Scope, what: str) -> None:
    """One INFO line for the first refusal of an address with a status, DEBUG for its
    repeats (counted, then reported in one INFO line): a flood does not fill the log. A
    refused origin is named (bounded and escaped), so the operator sees what to allow; no
    other header is ever shown."""
    address = address_of(scope)
    reason = refusal.reason
    if refusal.status == 403:
        origin = headers_of(scope).get("origin")
        if origin is not None:
            reason = f"{reason}: {shown(origin)}"
    level = logging.DEBUG
    if refusal.status in LOGGED_REFUSALS:
        first, ended = guard.refusals.note(address, refusal.status)
        for repeats in ended:
            logger.info(
                "...and %d more %d refusals from %s in the %.0f s after its first",
                repeats.count,
                repeats.status,
                repeats.address,
                repeats.seconds,
            )
        level = logging.INFO if first else logging.DEBUG
    logger.log(level, "refused a %s from %s (%d): %s", what, address, refusal.status, reason)
