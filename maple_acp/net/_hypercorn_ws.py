"""The WebSocket rules hypercorn's own stream leaves out, carried as a subclass of it.

hypercorn (0.17, 0.18) offers no setting for any of these, so the listener installs
:class:`BoundedWebSocketStream` as the stream class of hypercorn's HTTP/1.1 and HTTP/2
protocols (:func:`configure_websocket`). The class changes nothing for a server whose config
it did not mark: another hypercorn server in the same process keeps hypercorn's behaviour.

- **No permessage-deflate.** hypercorn accepts the extension whenever a client offers it, and
  wsproto inflates a frame without a bound before any size is checked: one 100 KB frame can
  cost hundreds of MiB. The offer is taken out of the request before hypercorn answers it, so
  the handshake never accepts it; a frame sent compressed anyway (RSV1 set) is a protocol
  error (1002) that ends its connection.
- **A message is capped in bytes**, checked before a part is kept (hypercorn counts characters,
  after keeping them): past the cap a close frame with 1009 goes out at once, nothing more the
  peer sends is kept, and the transport ends when the peer answers the close or
  :data:`CLOSE_ANSWER_S` later.
- **Liveness.** A ping goes out every :data:`PING_INTERVAL_S`; a peer that leaves one
  unanswered for :data:`PONG_TIMEOUT_S` has vanished (a dropped network sends no FIN): its
  stream ends as if it had disconnected, so the application releases what it held.
- **Many messages, one write.** The scope names :data:`SEND_MANY` among its extensions: the
  application may send ``{"type": SEND_MANY, "messages": [...]}``, text messages given as their
  UTF-8 bytes, framed together here and written to the socket at once. hypercorn writes each
  ``websocket.send`` on its own (one system call per message, where the Unix socket writes a
  batch of lines in one), and wsproto's framing of a message costs more than the peer's whole
  work on it; a server's unmasked text frame is a header and the bytes (RFC 6455, 5.2).

``tests/net/test_websocket_bounds.py`` fails when hypercorn changes what this relies on.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Final

import attrs
import trio
from hypercorn.protocol import h2 as _h2_protocol
from hypercorn.protocol import h11 as _h11_protocol
from hypercorn.protocol.events import Data, Event, Request, StreamClosed
from hypercorn.protocol.ws_stream import ASGIWebsocketState, WSStream
from hypercorn.utils import UnexpectedMessageError
from wsproto.connection import ConnectionState
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason

from maple_acp.net._errors import HttpSetupError
from maple_acp.net._websocket import SEND_MANY

logger = logging.getLogger(__name__)

#: A ping goes out this often: it proves the peer is there, and keeps proxies' idle timers off.
PING_INTERVAL_S: Final = 15.0
#: A ping unanswered this long means the peer vanished without a FIN: end like a disconnect.
PONG_TIMEOUT_S: Final = 30.0
#: A peer sent a close frame (a message past the cap) has this long to answer it.
CLOSE_ANSWER_S: Final = 5.0
#: The config attribute that marks a hypercorn server as this listener's.
_POLICY_ATTRIBUTE: Final = "maple_acp_websocket"


@attrs.frozen
class WebSocketPolicy:
    """What a marked server's WebSockets keep to."""

    #: The largest message, in bytes after UTF-8 encoding.
    max_message_bytes: int
    ping_interval_s: float = PING_INTERVAL_S
    pong_timeout_s: float = PONG_TIMEOUT_S


def configure_websocket(config: Any, max_message_bytes: int) -> None:
    """Mark ``config`` (a ``hypercorn.config.Config``) so that its WebSockets keep to
    :class:`WebSocketPolicy`, and install :class:`BoundedWebSocketStream` as the stream class
    hypercorn builds for a WebSocket (once per process; harmless to repeat)."""
    config.websocket_max_message_size = max_message_bytes
    # hypercorn's own pings never look for a pong; ours do.
    config.websocket_ping_interval = None
    setattr(config, _POLICY_ATTRIBUTE, WebSocketPolicy(max_message_bytes))
    for module in (_h11_protocol, _h2_protocol):
        if not issubclass(getattr(module, "WSStream", object), WSStream):
            # Serving WebSockets without these bounds is worse than not serving.
            raise HttpSetupError(
                f"this hypercorn ({module.__name__}) builds WebSocket streams in a way "
                "maple-acp does not know; install hypercorn 0.17 or 0.18"
            )
        setattr(module, "WSStream", BoundedWebSocketStream)  # noqa: B010


def text_frame_header(size: int) -> bytes:
    """The header of a final, unmasked text frame of ``size`` bytes (RFC 6455, 5.2)."""
    if size < 126:
        return bytes((0x81, size))
    if size < 0x10000:
        return b"\x81\x7e" + size.to_bytes(2, "big")
    return b"\x81\x7f" + size.to_bytes(8, "big")


class MessageTooLarge(Exception):
    pass


class ByteBoundedMessage:
    """The parts of one inbound message, refused once their UTF-8 size would pass the cap."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._parts: list[Any] = []
        self._size = 0
        self._text = True

    def add(self, event: TextMessage | BytesMessage) -> None:
        """Error handling: :class:`MessageTooLarge` before a part past the cap is kept."""
        data = event.data
        if isinstance(data, str):
            # isascii() is O(1) on CPython; only other text pays for an encode.
            size = len(data) if data.isascii() else len(data.encode())
        else:
            size = len(data)
        if self._size + size > self._max_bytes:
            self.clear()
            raise MessageTooLarge
        self._size += size
        self._text = isinstance(event, TextMessage)
        self._parts.append(data)

    def take(self) -> dict[str, Any]:
        """The whole message as an ASGI ``websocket.receive`` event; the buffer is emptied."""
        if self._text:
            message: dict[str, Any] = {"text": "".join(self._parts), "bytes": None}
        else:
            message = {"text": None, "bytes": b"".join(self._parts)}
        self.clear()
        return {"type": "websocket.receive", **message}

    def clear(self) -> None:
        self._parts = []
        self._size = 0


class PongWatch:
    """Whether the peer owes a pong, and since when (the oldest ping it has not answered)."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self.unanswered_since: float | None = None

    def pinged(self, now: float) -> None:
        if self.unanswered_since is None:
            self.unanswered_since = now

    def answered(self) -> None:
        self.unanswered_since = None

    def overdue(self, now: float) -> bool:
        since = self.unanswered_since
        return since is not None and now - since >= self._timeout_s


class BoundedWebSocketStream(WSStream):
    """hypercorn's WebSocket stream with the rules in the module docstring, for a server
    whose config :func:`configure_websocket` marked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._policy: WebSocketPolicy | None = getattr(self.config, _POLICY_ATTRIBUTE, None)
        if self._policy is not None:
            self._message = ByteBoundedMessage(self._policy.max_message_bytes)
            self._pongs = PongWatch(self._policy.pong_timeout_s)
        # Both wait in tasks of hypercorn's connection, which waits for them: a closed stream
        # cancels them so that its transport is not held open.
        self._keep_alive_scope = trio.CancelScope()
        self._close_wait_scope = trio.CancelScope()
        self._pinging = False

    async def handle(self, event: Event) -> None:
        if self._policy is not None:
            if isinstance(event, Request):
                # hypercorn answers whatever extensions the request offers; offer none.
                headers = [
                    (name, value)
                    for name, value in event.headers
                    if name.lower() != b"sec-websocket-extensions"
                ]
                event = dataclasses.replace(event, headers=headers)
            elif isinstance(event, StreamClosed):
                self._keep_alive_scope.cancel()
                self._close_wait_scope.cancel()
        await super().handle(event)

    # hypercorn builds the scope in ``handle`` before the application starts: the extension is
    # added as it is set, so the application sees it from its first look.
    @property
    def scope(self) -> Any:
        return self._scope

    @scope.setter
    def scope(self, scope: Any) -> None:
        if getattr(self.config, _POLICY_ATTRIBUTE, None) is not None:
            scope["extensions"] = {**scope.get("extensions", {}), SEND_MANY: {}}
        self._scope = scope

    async def app_send(self, message: Any) -> None:
        if message is None or message["type"] != SEND_MANY or self._policy is None:
            await super().app_send(message)
            return
        if self.closed:
            return  # as hypercorn's: the application may finish after the close
        if self.state is not ASGIWebsocketState.CONNECTED:
            raise UnexpectedMessageError(self.state, message["type"])
        if self.connection.state is not ConnectionState.OPEN:
            return  # closing: wsproto refuses a late message, and hypercorn drops it so
        # Framed here, not by wsproto: no extension is ever accepted (see above) and no
        # message is ever sent in parts, so a frame is its header and the message.
        frames: list[bytes] = []
        for data in message["messages"]:
            frames.append(text_frame_header(len(data)))
            frames.append(data)
        await self.send(Data(stream_id=self.stream_id, data=b"".join(frames)))

    async def _accept(self, message: Any) -> None:
        await super()._accept(message)
        if self._policy is not None:
            self.task_group.spawn(self._keep_alive, self._policy)

    async def _handle_events(self) -> None:
        if self._policy is None:
            await super()._handle_events()
            return
        for event in self.connection.events():
            if isinstance(event, (TextMessage, BytesMessage)):
                if self.connection.state is not ConnectionState.OPEN:
                    continue  # after our close frame, nothing more is kept
                try:
                    self._message.add(event)
                except MessageTooLarge:
                    logger.info(
                        "closing a WebSocket whose message passed %d bytes",
                        self._policy.max_message_bytes,
                    )
                    # The peer reads the close frame before the transport ends (closing a
                    # socket with unread input resets it, and a reset can lose that frame).
                    await self._send_wsproto_event(CloseConnection(CloseReason.MESSAGE_TOO_BIG))
                    self.task_group.spawn(self._close_unanswered)
                    continue
                if event.message_finished:
                    assert self.app_put is not None
                    await self.app_put(self._message.take())
            elif isinstance(event, Ping):
                await self._send_wsproto_event(event.response())
            elif isinstance(event, Pong):
                self._pongs.answered()
            elif isinstance(event, CloseConnection):
                if self.connection.state is ConnectionState.REMOTE_CLOSING:
                    await self._send_wsproto_event(event.response())
                elif self.connection.state is ConnectionState.OPEN:
                    # wsproto reports a frame it could not read (a compressed one among them)
                    # as a close the peer did not send, and reads nothing after it: answer
                    # with its code and end now. The reason is wsproto's words, never the
                    # peer's bytes.
                    logger.info(
                        "closing a WebSocket that sent a frame out of protocol: %s", event.reason
                    )
                    await self._send_wsproto_event(CloseConnection(event.code))
                await self.send(StreamClosed(stream_id=self.stream_id))
                return

    async def _close_unanswered(self) -> None:
        """End the stream if the peer has not answered our close frame within
        :data:`CLOSE_ANSWER_S`."""
        with self._close_wait_scope:
            await trio.sleep(CLOSE_ANSWER_S)
        if not self._close_wait_scope.cancelled_caught and not self.closed:
            await self.send(StreamClosed(stream_id=self.stream_id))

    async def _keep_alive(self, policy: WebSocketPolicy) -> None:
        """Ping every ``policy.ping_interval_s``; end the stream once a ping is overdue.

        A ping is written in a task of hypercorn's connection, never awaited here: a write to
        a vanished peer waits (shielded) for as long as TCP retries, and the deadline must not
        wait with it. Ending the stream closes the transport, which ends that write."""
        with self._keep_alive_scope:
            while True:
                await trio.sleep(policy.ping_interval_s)
                now = trio.current_time()
                if self._pongs.overdue(now):
                    break
                self._pongs.pinged(now)
                if not self._pinging:
                    self._pinging = True
                    self.task_group.spawn(self._ping)
        if self._keep_alive_scope.cancelled_caught or self.closed:
            return
        logger.info(
            "ending a WebSocket whose peer answered no ping for %.0f s", policy.pong_timeout_s
        )
        # Outside the keep-alive scope: ending the stream cancels that scope, and must not
        # cancel its own ending. No close frame: it would only wait on a vanished socket.
        await self.send(StreamClosed(stream_id=self.stream_id))

    async def _ping(self) -> None:
        try:
            await self._send_wsproto_event(Ping())
        finally:
            self._pinging = False
