"""The peer over a message transport: whole messages each way, each with its route.

A transport in memory stands for the network's: what the peer writes is recorded with its
route, and a test decides when a write counts as done (the moment the peer gives its credit
back). The rules that are the peer's (the frame cap, exact ids, the credit window) hold here as
they do over a byte stream.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from maple_acp.rpc import (
    JsonRpcPeer,
    LineTransport,
    MessageTransport,
    Params,
    Received,
    Route,
)

#: Guard against hangs only; no test asserts how long anything took.
HANG_GUARD_SECONDS = 20


class MemoryTransport(MessageTransport):
    """Messages in through :meth:`deliver`; what the peer writes kept in :attr:`written` as
    (message, route). While :attr:`hold` is set, a write does not return (nor count)."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[tuple[bytes, Route]](16)
        self.written: list[tuple[bytes, Route]] = []
        self.hold: trio.Event | None = None
        self.sends = 0
        self.wrote = trio.Event()
        self.closed = False

    async def deliver(self, message: bytes, route: Route = None) -> None:
        await self._send.send((message, route))

    def finish(self) -> None:
        self._send.close()

    async def receive(self) -> Received | None:
        try:
            message, route = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return None
        return (message,), route

    async def send(self, lines: list[bytes], routes: list[Route]) -> None:
        self.sends += 1
        if self.hold is not None:
            await self.hold.wait()
        self.written.extend(zip(lines, routes, strict=True))
        self.wrote.set()
        self.wrote = trio.Event()

    async def aclose(self) -> None:
        self.closed = True
        self._receive.close()
        await trio.lowlevel.checkpoint()

    async def wait_for(self, count: int) -> list[tuple[Any, Route]]:
        while len(self.written) < count:
            await self.wrote.wait()
        return [(orjson.loads(line), route) for line, route in self.written]


async def echo(method: str, params: Params) -> Any:
    return {"method": method, "params": params}


def request(msg_id: Any, method: str, params: Any = None) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})


async def test_answers_take_their_requests_routes_and_sends_take_theirs() -> None:
    transport = MemoryTransport()
    peer = JsonRpcPeer(transport, on_request=echo)
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await transport.deliver(request(1, "ask", {"sessionId": "s1"}), "s1")
            await transport.deliver(request(2, "ask"))
            await transport.deliver(b"{not json", "s3")
            answers = dict(
                (message.get("id"), route) for message, route in await transport.wait_for(3)
            )
            assert answers == {1: "s1", 2: None, None: "s3"}
            await peer.notify("session/update", {"n": 1}, route="s2")
            await peer.notify_encoded(b'{"jsonrpc":"2.0","method":"x"}\n', route="s4")
            await peer.notify_lines([b'{"jsonrpc":"2.0","method":"y"}\n'], route="s5")
            sent = await transport.wait_for(6)
            assert [route for _, route in sent[3:]] == ["s2", "s4", "s5"]
            # The peer's own request, and the notice that withdraws it, take the caller's.
            asking = trio.CancelScope()

            async def ask() -> None:
                with asking:
                    await peer.request("ask/client", {}, route="s6", cancel_remote=True)

            nursery.start_soon(ask)
            asked = await transport.wait_for(7)
            assert (asked[6][0]["method"], asked[6][1]) == ("ask/client", "s6")
            asking.cancel()
            withdrawn = await transport.wait_for(8)
            assert (withdrawn[7][0]["method"], withdrawn[7][1]) == ("$/cancel_request", "s6")
            nursery.cancel_scope.cancel()


async def test_a_request_with_a_route_and_a_batch_answer_keep_it() -> None:
    transport = MemoryTransport()
    peer = JsonRpcPeer(transport, on_request=echo)
    peer.accept_batches = True
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            got: list[Any] = []

            async def ask() -> None:
                got.append(await peer.request("client/do", {"x": 1}, route="s9"))

            nursery.start_soon(ask)
            ((sent, route),) = await transport.wait_for(1)
            assert route == "s9"
            await transport.deliver(orjson.dumps({"jsonrpc": "2.0", "id": sent["id"], "result": 7}))
            batch = b"[" + request("a", "m1") + b"," + request("b", "m2") + b"]"
            await transport.deliver(batch, "s7")
            answers = await transport.wait_for(2)
            assert [m["id"] for m in answers[1][0]] == ["a", "b"]
            assert answers[1][1] == "s7"
            assert got == [7]
            nursery.cancel_scope.cancel()


async def test_a_long_integer_id_comes_back_exact_over_messages() -> None:
    transport = MemoryTransport()
    peer = JsonRpcPeer(transport, on_request=echo)
    long_id = 2**70 + 1
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            line = b'{"jsonrpc":"2.0","id":%d,"method":"ask"}' % long_id
            await transport.deliver(line, "s1")
            await transport.wait_for(1)
            line, route = transport.written[0]
            assert b'"id":%d' % long_id in line
            assert route == "s1"
            nursery.cancel_scope.cancel()


async def test_a_message_is_read_whole_raw_newlines_and_all() -> None:
    transport = MemoryTransport()
    peer = JsonRpcPeer(transport, on_request=echo)
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await transport.deliver(b'{"jsonrpc": "2.0",\r\n "id": 5,\n "method": "ask"}')
            ((answer, _),) = await transport.wait_for(1)
            assert answer["id"] == 5
            assert answer["result"]["method"] == "ask"
            nursery.cancel_scope.cancel()


async def test_the_frame_cap_holds_over_messages(caplog: pytest.LogCaptureFixture) -> None:
    cap = 200
    transport = MemoryTransport()
    peer = JsonRpcPeer(transport, on_request=echo, max_line_bytes=cap)
    at_cap = request(1, "ask", {"pad": ""})
    at_cap = request(1, "ask", {"pad": "x" * (cap - len(at_cap))})
    assert len(at_cap) == cap
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await transport.deliver(b"  ")  # blank: skipped, as a blank line is
            await transport.deliver(at_cap)
            ((answer, _),) = await transport.wait_for(1)
            assert answer["id"] == 1
            with caplog.at_level(logging.WARNING, logger="maple_acp.rpc"):
                # One byte past the cap: the connection ends (serve returns by itself).
                await transport.deliver(at_cap[:-1] + b" }")
    assert f"exceeds {cap} bytes" in peer.close_reason
    assert any("closing the connection" in r.getMessage() for r in caplog.records)
    assert transport.closed
    assert len(transport.written) == 1


async def test_credit_comes_back_when_the_transport_says_written() -> None:
    transport = MemoryTransport()
    transport.hold = trio.Event()
    peer = JsonRpcPeer(transport, max_outbound_lines=2)
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await peer.notify("one", route="a")
            await peer.notify("two", route="b")
            third = trio.Event()

            async def notify_third() -> None:
                await peer.notify("three", route="c")
                third.set()

            nursery.start_soon(notify_third)
            await trio.testing.wait_all_tasks_blocked()
            # The writer has the first two in hand, the transport has not said they are written.
            assert transport.sends == 1
            assert not third.is_set()
            assert peer.credit.lines_in_use == 2
            transport.hold.set()
            await third.wait()
            sent = await transport.wait_for(3)
            assert [(m["method"], route) for m, route in sent] == [
                ("one", "a"),
                ("two", "b"),
                ("three", "c"),
            ]
            nursery.cancel_scope.cancel()


async def test_the_other_side_finishing_ends_the_connection_after_answers() -> None:
    transport = MemoryTransport()
    peer = JsonRpcPeer(transport, on_request=echo)
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await transport.deliver(request(1, "ask"), "s1")
            transport.finish()
            await transport.wait_for(1)
        assert peer.closed
        assert transport.closed


async def test_a_byte_stream_is_framed_in_lines_by_the_line_transport() -> None:
    left, right = trio.testing.memory_stream_pair()
    transport = LineTransport(left)
    peer = JsonRpcPeer(transport, on_request=echo)
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await right.send_all(request(1, "a") + b"\n" + request(2, "b") + b"\n")
            await peer.notify("n", route="ignored on a socket")
            data = b""
            while data.count(b"\n") < 3:
                data += await right.receive_some()
            lines = [orjson.loads(line) for line in data.splitlines()]
            assert sorted(str(m.get("id", m.get("method"))) for m in lines) == ["1", "2", "n"]
            nursery.cancel_scope.cancel()
