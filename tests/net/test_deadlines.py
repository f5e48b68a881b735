"""The listener's deadlines on a mock clock: a Streamable HTTP connection with no stream open
for 60 s ends like a disconnect; a session stream whose client stays away past the 30 s resume
window hands what it held to the connection stream (never dropped) and answers a late
``Last-Event-ID`` with 410.

The ASGI application is called directly, with the ASGI messages a server would pass; behind
it a real JSON-RPC peer serves each connection's channel."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import orjson
import trio
import trio.testing

from maple_acp.net import AcpNetworkApp, GuardPolicy, NetworkLimits, RequestGuard
from maple_acp.rpc import JsonRpcPeer

TOKEN = "secret-token"
SESSION = "s-1"


class PeerHost:
    """A host whose connections are plain JSON-RPC peers: ``initialize`` answers ``{}``,
    ``poke`` makes the peer send a ``session/update`` about ``SESSION`` and answer ``{}``."""

    def __init__(self) -> None:
        self.active = 0
        self.peers: list[JsonRpcPeer] = []
        self.ended = 0

    def try_admit(self) -> bool:
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1

    async def session_exists(self, session_id: str) -> bool:
        return session_id == SESSION

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        peer: JsonRpcPeer

        async def on_request(method: str, params: Any) -> Any:
            if method == "poke":
                for n in range(params["n"], params["n"] + params.get("count", 1)):
                    await peer.notify(
                        "session/update", {"sessionId": SESSION, "n": n}, route=SESSION
                    )
            return {}

        peer = JsonRpcPeer(stream, on_request=on_request)
        self.peers.append(peer)
        try:
            await peer.serve()
        finally:
            self.ended += 1


class Call:
    """One ASGI request: what the app sent, and a way to say the client went away."""

    def __init__(self, method: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.scope: MutableMapping[str, Any] = {
            "type": "http",
            "method": method,
            "path": "/acp",
            "headers": [
                (k.lower().encode(), v.encode())
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
        #: While set, the client reads nothing: every body write blocks (a stalled browser).
        self.stalled = False
        self._unstalled = trio.Event()
        self.sent: list[MutableMapping[str, Any]] = []
        self.changed = trio.Event()
        self.done = trio.Event()

    async def receive(self) -> MutableMapping[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None  # type: ignore[assignment]
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if self.stalled and message["type"] == "http.response.body":
            await self._unstalled.wait()
        self.sent.append(message)
        self.changed.set()
        self.changed = trio.Event()

    def unstall(self) -> None:
        self.stalled = False
        self._unstalled.set()

    def leave(self) -> None:
        self._gone.set()

    async def run(self, app: AcpNetworkApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        finally:
            self.done.set()

    @property
    def status(self) -> int | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    def header(self, name: str) -> str | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                for key, value in message["headers"]:
                    if key.decode() == name:
                        return str(value.decode())
        return None

    def events(self) -> list[Any]:
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return [orjson.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]

    async def wait_for(self, count: int) -> list[Any]:
        while len(self.events()) < count:
            await self.changed.wait()
        return self.events()


def make_app(nursery: trio.Nursery, host: PeerHost) -> AcpNetworkApp:
    guard = RequestGuard(
        GuardPolicy.for_bind("127.0.0.1"), lambda offered: offered == TOKEN, trio.current_time
    )
    limits = NetworkLimits(keep_lines=256, keep_bytes=4 * 1024 * 1024, max_message_bytes=1 << 20)
    return AcpNetworkApp(host, guard, nursery, limits)


def rpc(method: str, params: Any, msg_id: int) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})


async def initialize(nursery: trio.Nursery, app: AcpNetworkApp) -> str:
    call = Call("POST", {"content-type": "application/json"}, rpc("initialize", {}, 0))
    await call.run(app)
    assert call.status == 200
    connection = call.header("acp-connection-id")
    assert connection is not None
    return connection


async def test_a_connection_with_no_stream_for_60_s_ends_like_a_disconnect(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    host = PeerHost()
    async with trio.open_nursery() as nursery:
        app = make_app(nursery, host)
        connection = await initialize(nursery, app)
        # A stream opened at 50 s and closed at 80 s: the idle bound counts from 80 s.
        await trio.sleep(50)
        assert connection in app.connections
        stream = Call("GET", {"accept": "text/event-stream", "acp-connection-id": connection})
        nursery.start_soon(stream.run, app)
        await trio.sleep(30)
        stream.leave()
        await stream.done.wait()
        started = trio.current_time()
        await trio.sleep(59)
        assert connection in app.connections
        assert host.ended == 0
        with trio.fail_after(5):
            while True:
                if connection not in app.connections:
                    break
                await trio.sleep(0.5)
        # Ended as a disconnect does: the input finished, the peer ended, the slot came back.
        assert 60 <= trio.current_time() - started <= 62
        assert host.ended == 1
        assert host.active == 0
        nursery.cancel_scope.cancel()


async def test_a_session_stream_away_past_the_window_gives_its_messages_to_the_connection(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    host = PeerHost()
    async with trio.open_nursery() as nursery:
        app = make_app(nursery, host)
        connection = await initialize(nursery, app)
        sse = {"accept": "text/event-stream", "acp-connection-id": connection}
        main = Call("GET", sse)
        nursery.start_soon(main.run, app)
        session = Call("GET", {**sse, "acp-session-id": SESSION})
        nursery.start_soon(session.run, app)
        poke = {"content-type": "application/json", "acp-connection-id": connection}
        await Call("POST", poke, rpc("poke", {"n": 1}, 1)).run(app)
        # The session's update goes to its stream, the answer (no session named) to the
        # connection's.
        assert [e["params"]["n"] for e in await session.wait_for(1)] == [1]
        assert (await main.wait_for(1))[0]["id"] == 1
        session.leave()
        await session.done.wait()
        left = trio.current_time()
        # Away: the next update waits for the session's client (it may come back with
        # Last-Event-ID) and holds its credit meanwhile.
        await Call("POST", poke, rpc("poke", {"n": 2}, 2)).run(app)
        await trio.sleep(29)
        assert not [e for e in main.events() if e.get("params", {}).get("n") == 2]
        # Past the window it goes to the connection stream: never dropped.
        with trio.fail_after(5):
            while True:
                moved = [e for e in main.events() if e.get("params", {}).get("n") == 2]
                if moved:
                    break
                await main.changed.wait()
        assert 29 < trio.current_time() - left <= 31
        late = Call("GET", {**sse, "acp-session-id": SESSION, "last-event-id": "1"})
        await late.run(app)
        assert late.status == 410
        # A fresh stream for the session (no Last-Event-ID) is served again.
        fresh = Call("GET", {**sse, "acp-session-id": SESSION})
        nursery.start_soon(fresh.run, app)
        await Call("POST", poke, rpc("poke", {"n": 3}, 3)).run(app)
        assert [e["params"]["n"] for e in await fresh.wait_for(1)] == [3]
        nursery.cancel_scope.cancel()


async def test_a_stalled_stream_holds_at_most_the_credit_window() -> None:
    host = PeerHost()
    async with trio.open_nursery() as nursery:
        app = make_app(nursery, host)
        connection = await initialize(nursery, app)
        sse = {"accept": "text/event-stream", "acp-connection-id": connection}
        main = Call("GET", sse)
        nursery.start_soon(main.run, app)
        session = Call("GET", {**sse, "acp-session-id": SESSION})
        session.stalled = True
        nursery.start_soon(session.run, app)
        poke = {"content-type": "application/json", "acp-connection-id": connection}
        await Call("POST", poke, rpc("poke", {"n": 0, "count": 5000}, 1)).run(app)
        await trio.testing.wait_all_tasks_blocked()
        # The sender waits for credit; what the host holds for the stalled client is bounded
        # by the connection's window, not by what the agent wanted to say.
        peer = host.peers[0]
        channel = app.connections[connection].channel
        held = channel.sessions[SESSION].pending
        assert peer.credit.lines_in_use <= 256
        assert 0 < len(held) <= 256
        assert sum(len(line) for _, line in held) <= 4 * 1024 * 1024
        assert main.events() == []
        # The client reads again: everything arrives, once and in order.
        session.unstall()
        with trio.fail_after(10):
            events = await session.wait_for(5000)
        assert [e["params"]["n"] for e in events] == list(range(5000))
        assert (await main.wait_for(1))[0]["id"] == 1
        nursery.cancel_scope.cancel()
