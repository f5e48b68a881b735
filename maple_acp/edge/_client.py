"""The typed channel to the client: ``session/update`` and the client methods the agent calls.

Outbound calls are driven by ``wire.CLIENT_METHODS`` as inbound dispatch is by
``wire.AGENT_METHODS``: a typed request goes out unstructured, and the answer is structured
with the method's result type. A malformed answer raises ``ProtocolError(-32602)``, which
the callers (the permission question, the trust dialog) treat as a failed answer and fail
closed on, like ``ConnectionClosed`` and ``OutboundFrameTooLarge``.

Resource handling: a request holds its outbound credit until answered or the connection ends
(docs/protocol.md, outbound admission); updates are charged by the peer. Cancellation: every
call is a checkpoint; a cancelled request is withdrawn by the peer and its late answer dropped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from maple_acp.edge._dialect import ClientFeatures, Outbound
from maple_acp.edge._projection import UPDATE_METHOD, encode_update
from maple_acp.rpc import JsonRpcPeer
from maple_acp.wire import (
    CLIENT_METHODS,
    CreateElicitationRequest,
    CreateElicitationResponse,
    RequestPermissionResponse,
    structure_params,
    unstructure,
)

#: Updates handed to the peer at once by :meth:`ClientChannel.send_many`: half the outbound
#: line budget, so a batch never waits for credit it could never get in one go.
SEND_BATCH: Final = 128

PERMISSION_METHOD: Final = "session/request_permission"
ELICITATION_METHOD: Final = "elicitation/create"
MCP_MESSAGE_METHOD: Final = "mcp/message"


class ClientChannel:
    """Everything the agent sends the client on one connection."""

    def __init__(self, peer: JsonRpcPeer) -> None:
        self._peer = peer
        #: What the client declared at ``initialize`` (nothing before it).
        self.features = ClientFeatures()
        #: Sessions whose updates one task alone may send for now (a replay), with the task
        #: and the event that ends the hold.
        self._holds: dict[str, tuple[trio.lowlevel.Task, trio.Event]] = {}

    @property
    def closed(self) -> bool:
        return self._peer.closed

    # -- session/update ----------------------------------------------------------------------

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Within the block only the calling task sends updates of ``session_id``: every other
        task's wait until it ends (a replay is never interleaved with live updates). A second
        hold of the same session waits for the first to end."""
        await self._held(session_id)
        me = trio.lowlevel.current_task()
        released = trio.Event()
        self._holds[session_id] = (me, released)
        try:
            yield
        finally:
            del self._holds[session_id]
            released.set()

    async def _held(self, session_id: str) -> None:
        while (hold := self._holds.get(session_id)) is not None:
            if hold[0] is trio.lowlevel.current_task():
                return
            await hold[1].wait()

    async def send(self, session_id: str, update: Outbound) -> None:
        """Queue one ``session/update`` about ``session_id``: a typed notification, or a text
        chunk's line. (The session is the message's route: a transport with a stream per
        session sends it there.)"""
        if self._holds:
            await self._held(session_id)
        if type(update) is bytes:
            await self._peer.notify_encoded(update, session_id)
        else:
            await self._peer.notify(UPDATE_METHOD, unstructure(update), route=session_id)

    async def send_many(self, session_id: str, updates: Iterable[Outbound]) -> None:
        """Queue many updates in order, handed to the peer :data:`SEND_BATCH` lines at a time
        (a history replay: one hand-off per batch instead of one per line)."""
        if self._holds:
            await self._held(session_id)
        batch: list[bytes] = []
        for update in updates:
            batch.append(update if isinstance(update, bytes) else encode_update(update))
            if len(batch) >= SEND_BATCH:
                await self._peer.notify_lines(batch, session_id)
                batch = []
        if batch:
            await self._peer.notify_lines(batch, session_id)

    async def send_lines(self, session_id: str, lines: list[bytes]) -> None:
        """Queue finished update lines together (the streaming path: one hand-off)."""
        if self._holds:
            await self._held(session_id)
        await self._peer.notify_lines(lines, session_id)

    async def notify(self, session_id: str, method: str, params: object) -> None:
        """Queue one extension notification about ``session_id`` (typed params)."""
        if self._holds:
            await self._held(session_id)
        await self._peer.notify(method, unstructure(params), route=session_id)

    async def drain(self) -> None:
        """Wait until every update queued so far is written to the transport."""
        await self._peer.drain()

    # -- client methods ----------------------------------------------------------------------

    async def _call(
        self, method: str, session_id: str, request: object, *, withdraw: bool = False
    ) -> Any:
        spec = CLIENT_METHODS[method]
        result = await self._peer.request(
            method,
            unstructure(request),
            hold_credit=True,
            route=session_id,
            cancel_remote=withdraw,
        )
        return structure_params(result, spec.result)

    async def request_permission(
        self, session_id: str, request: object, *, withdraw: bool = False
    ) -> RequestPermissionResponse:
        """Ask a permission question about ``session_id`` (its shape is the session's
        dialect's). With ``withdraw``, a question abandoned before its answer (another window
        answered it, the run ended) is withdrawn from the client with ``$/cancel_request``."""
        response: RequestPermissionResponse = await self._call(
            PERMISSION_METHOD, session_id, request, withdraw=withdraw
        )
        return response

    async def mcp_message(self, session_id: str, params: Mapping[str, Any]) -> Any:
        """Send one ``mcp/message`` (its params already in the schema's flat shape) about
        ``session_id`` and return the client's answer as it came: the MCP layer reads the
        inner outcome. Abandoning it tells the client (``$/cancel_request``); it holds no
        credit while it waits (nothing the client shows is ordered behind it)."""
        return await self._peer.request(
            MCP_MESSAGE_METHOD, dict(params), cancel_remote=True, route=session_id
        )

    async def elicit(
        self, session_id: str, request: CreateElicitationRequest
    ) -> CreateElicitationResponse:
        response: CreateElicitationResponse = await self._call(
            ELICITATION_METHOD, session_id, request
        )
        return response
