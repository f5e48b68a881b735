"""The HTTP side of a transient server: the real URL hidden from everything that logs, and a
bound on every response body.

Resource handling: each transport wraps an inner one and closes it with itself. Error handling:
a body past its bound fails with :class:`ResponseTooLarge`, a ``StreamError`` the MCP transport
answers the waiting request with; a request for any URL but the stand-in is refused without
traffic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import httpx2

from maple_acp.mcp._catalog import MAX_RESULT_BYTES

#: One server-sent event may carry a whole result: twice the result limit leaves room for the
#: JSON-RPC envelope, so a result just over the limit meets the precise size check after it.
MAX_SSE_EVENT_BYTES: Final = 2 * MAX_RESULT_BYTES
#: One HTTP response body. The transport reads a JSON body whole, so this bounds memory against
#: a hostile server; it is above any event a legitimate result needs.
MAX_RESPONSE_BYTES: Final = 2 * MAX_SSE_EVENT_BYTES


def stand_in_url(index: int) -> str:
    """The URL the MCP SDK and the HTTP client see (and log) for server ``index``.

    Both log the URL of every request (the SDK at DEBUG, httpx at INFO), and a URL may carry a
    credential in its path or query; only :class:`HiddenTargetTransport` knows the real one."""
    return f"http://transient-mcp-{index}.invalid/mcp"


class HiddenTargetTransport(httpx2.AsyncBaseTransport):
    """Sends every request for ``stand_in`` to ``target`` instead, so the real URL is never in
    a request object that anything else logs. Any other URL is refused without traffic."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, *, stand_in: str, target: str) -> None:
        self._inner = inner
        self._stand_in = httpx2.URL(stand_in)
        self._target = httpx2.URL(target)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url != self._stand_in:
            raise httpx2.UnsupportedProtocol("request outside the MCP server's endpoint")
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
        headers.insert(0, (b"Host", self._target.netloc))
        # A new request object: the client logs the one it built, which keeps the stand-in.
        sent = httpx2.Request(
            request.method,
            self._target,
            headers=headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        return await self._inner.handle_async_request(sent)

    async def aclose(self) -> None:
        await self._inner.aclose()


class ResponseTooLarge(httpx2.StreamError):
    """A response body passed :data:`MAX_RESPONSE_BYTES`.

    A ``StreamError`` so that the MCP transport answers the waiting request with an error
    instead of tearing the whole session down."""


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ResponseTooLarge(f"response body larger than {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """Wraps a transport so that no response body can grow past ``limit`` bytes."""

    def __init__(
        self, inner: httpx2.AsyncBaseTransport, *, limit: int = MAX_RESPONSE_BYTES
    ) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_BoundedBody(response.stream, self._limit),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()
