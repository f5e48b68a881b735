"""Two sessions on one Streamable HTTP connection, on a mock clock: while session A's client is
away (its SSE stream has no receiver), A's lines park on its stream and session B's traffic
goes on at once; A's client comes back with ``Last-Event-ID`` and gets what it missed, in
order; what A parks stays within the credit window.

The ASGI application is called directly, with the messages a server would pass; behind it a
real JSON-RPC peer serves the connection's channel."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import orjson
import trio
import trio.testing

from maple_acp.net import AcpNetworkApp, GuardPolicy, NetworkLimits, RequestGuard
from maple_acp.rpc import FRAME_OVERHEAD_BYTES, JsonRpcPeer

TOKEN = "secret-token"
SESSIONS = ("s-a", "s-b")


class SayHost:
    """A host whose connections are plain JSON-RPC peers: ``initialize`` answers ``{}``;
    ``say`` sends ``count`` ``session/update`` notifications about its ``sessionId``, then
    answers ``{}`` (the answer goes the same way: the request named the session)."""

    def __init__(self) -> None:
        self.peers: list[JsonRpcPeer] = []

    def try_admit(self) -> bool:
        return True

    def release(self) -> None:
        pass

    async def session_exists(self, session_id: str) -> bool:
        return session_id in SESSIONS

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        peer: JsonRpcPeer

        async def on_request(method: str, params: Any) -> Any:
            if method == "say":
                for n in range(params["count"]):
                    session_id = params["sessionId"]
                    await peer.notify(
                        "session/update", {"sessionId": session_id, "n": n}, route=session_id
                    )
            return {}

        peer = JsonRpcPeer(stream, on_request=on_request)
        self.peers.append(peer)
        await peer.serve()


class Call:
    """One ASGI request: what the app sent, and a way to say the client went away."""

    def __init__(self, method: str, headers: dict[str, str], body: bytes | None = None) -> None:
        self.scope: MutableMapping[str, Any] = {
            "type": "http",
            "method": method,
            "path": "/acp",
            "headers": [
                (k.encode(), v.encode())
                for k, v in {
                    "host": "127.0.0.1:8765",
                    "authorization": f"Bearer {TOKEN}",
                    **headers,
                }.items()
            ],
            "client": ("127.0.0.1", 40000),
        }
        self._body = body
        self._gone = trio.Event()
        self.sent: list[MutableMapping[str, Any]] = []
        self.changed = trio.Event()
        self.done = trio.Event()

    async def receive(self) -> MutableMapping[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def leave(self) -> None:
        self._gone.set()

    async def run(self, app: AcpNetworkApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        finally:
            self.done.set()

    @property
    def status(self) -> int | None:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        return int(starts[0]["status"]) if starts else None

    def header(self, name: str) -> str:
        for message in self.sent:
            if message["type"] == "http.response.start":
                for key, value in message["headers"]:
                    if key.decode() == name:
                        return str(value.decode())
        raise AssertionError(f"no {name} header")

    def events(self) -> list[tuple[int, Any]]:
        """The SSE events so far: (id, message)."""
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        found: list[tuple[int, Any]] = []
        for raw in body.split(b"\n\n"):
            fields = dict(line.split(b": ", 1) for line in raw.split(b"\n") if b": " in line)
            if b"data" in fields:
                found.append((int(fields[b"id"]), orjson.loads(fields[b"data"])))
        return found

    async def wait_for(self, count: int) -> list[tuple[int, Any]]:
        while len(self.events()) < count:
            await self.changed.wait()
        return self.events()


def say(session_id: str, count: int, msg_id: int) -> bytes:
    params = {"sessionId": session_id, "count": count}
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "say", "params": params})


async def open_connection(
    nursery: trio.Nursery, keep_lines: int = 256
) -> tuple[AcpNetworkApp, str, dict[str, Call]]:
    """A connection with its connection stream and both sessions' streams open."""
    guard = RequestGuard(
        GuardPolicy.for_bind("127.0.0.1"), lambda offered: offered == TOKEN, trio.current_time
    )
    limits = NetworkLimits(
        keep_lines=keep_lines, keep_bytes=4 * 1024 * 1024, max_message_bytes=1 << 20
    )
    app = AcpNetworkApp(SayHost(), guard, nursery, limits)
    initialize = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})
    opened = Call("POST", {"content-type": "application/json"}, initialize)
    await opened.run(app)
    assert opened.status == 200
    connection = opened.header("acp-connection-id")
    streams = {"main": Call("GET", sse_headers(connection))}
    for session_id in SESSIONS:
        streams[session_id] = Call("GET", sse_headers(connection, session_id))
    for stream in streams.values():
        nursery.start_soon(stream.run, app)
    await trio.testing.wait_all_tasks_blocked()
    return app, connection, streams


def sse_headers(
    connection: str, session_id: str | None = None, last: int | None = None
) -> dict[str, str]:
    headers = {"accept": "text/event-stream", "acp-connection-id": connection}
    if session_id is not None:
        headers["acp-session-id"] = session_id
    if last is not None:
        headers["last-event-id"] = str(last)
    return headers


async def post(app: AcpNetworkApp, connection: str, body: bytes, session_id: str) -> None:
    headers = {
        "content-type": "application/json",
        "acp-connection-id": connection,
        "acp-session-id": session_id,
    }
    call = Call("POST", headers, body)
    await call.run(app)
    assert call.status == 202


async def test_a_session_whose_client_is_away_does_not_hold_up_another_session(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    a, b = SESSIONS
    async with trio.open_nursery() as nursery:
        app, connection, streams = await open_connection(nursery)
        await post(app, connection, say(a, 1, 1), a)
        seen = await streams[a].wait_for(2)
        assert [event_id for event_id, _ in seen] == [1, 2]
        streams[a].leave()
        await streams[a].done.wait()
        # A's client is away; a turn of A's goes on talking (it parks), then B's turn.
        await post(app, connection, say(a, 5, 2), a)
        channel = app.connections[connection].channel
        with trio.fail_after(1):
            while len(channel.sessions[a].pending) < 6:
                await channel.sessions[a].changed()
        started = trio.current_time()
        await post(app, connection, say(b, 3, 3), b)
        with trio.fail_after(1):
            events = await streams[b].wait_for(4)
        assert trio.current_time() - started < 1
        assert [m.get("params", {}).get("n") for _, m in events[:3]] == [0, 1, 2]
        assert events[3][1] == {"jsonrpc": "2.0", "id": 3, "result": {}}
        assert len(channel.sessions[a].pending) == 6
        # A's client comes back within the resume window: exactly what it missed, in order.
        await trio.sleep(10)
        back = Call("GET", sse_headers(connection, a, last=2))
        nursery.start_soon(back.run, app)
        with trio.fail_after(1):
            missed = await back.wait_for(6)
        assert [event_id for event_id, _ in missed] == [3, 4, 5, 6, 7, 8]
        assert [m["params"]["n"] for _, m in missed[:5]] == [0, 1, 2, 3, 4]
        assert missed[5][1]["id"] == 2
        assert not [
            m for _, m in streams["main"].events() if m.get("params", {}).get("sessionId") == a
        ]
        nursery.cancel_scope.cancel()


async def test_what_an_absent_session_parks_stays_within_the_credit_window(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    a, _ = SESSIONS
    window = 8
    async with trio.open_nursery() as nursery:
        app, connection, streams = await open_connection(nursery, keep_lines=window)
        streams[a].leave()
        await streams[a].done.wait()
        await post(app, connection, say(a, 50, 1), a)
        await trio.testing.wait_all_tasks_blocked()
        channel = app.connections[connection].channel
        parked = channel.sessions[a].pending
        assert 0 < len(parked) <= window
        assert channel.parked() == (
            len(parked),
            sum(len(line) + FRAME_OVERHEAD_BYTES for _, line in parked),
        )
        # The rest waits in the peer, holding its credit; when the client is back, all of it
        # comes, once and in order.
        back = Call("GET", sse_headers(connection, a, last=0))
        nursery.start_soon(back.run, app)
        with trio.fail_after(1):
            events = await back.wait_for(51)
        assert [event_id for event_id, _ in events] == list(range(1, 52))
        assert [m["params"]["n"] for _, m in events[:50]] == list(range(50))
        assert events[50][1]["id"] == 1
        nursery.cancel_scope.cancel()
