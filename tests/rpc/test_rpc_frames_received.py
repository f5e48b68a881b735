"""The inbound frame counter a handler uses to tell whether its message came first."""

from __future__ import annotations

import orjson
import pytest
import trio
import trio.lowlevel
import trio.testing

from maple_acp.rpc import JsonRpcPeer, Params, request_arrival
from maple_acp.rpc._peer import EOF_GRACE_S


async def test_counter_sees_request_before_a_later_notification() -> None:
    """A request's handler task starts after the reader has moved on, so arrival order can
    only be read from the counter taken at dispatch time."""
    seen: list[tuple[str, int]] = []
    near, far = trio.testing.memory_stream_pair()

    async def on_request(method: str, params: Params) -> None:
        return None

    async def on_notification(method: str, params: Params) -> None:
        seen.append((method, peer.frames_received))

    peer = JsonRpcPeer(near, on_request=on_request, on_notification=on_notification)
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.serve)
        assert peer.frames_received == 0
        await far.send_all(
            b'{"jsonrpc":"2.0","method":"first/note"}\n'
            b'{"jsonrpc":"2.0","id":1,"method":"work"}\n'
            b"\n"
            b'{"jsonrpc":"2.0","method":"later/note"}\n'
        )
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [("first/note", 1), ("later/note", 3)]
        await peer.aclose()


async def test_request_arrival_orders_a_request_against_a_later_notification() -> None:
    arrivals: list[int] = []
    notes: list[int] = []
    near, far = trio.testing.memory_stream_pair()

    async def on_request(method: str, params: Params) -> None:
        arrivals.append(request_arrival())

    async def on_notification(method: str, params: Params) -> None:
        notes.append(peer.frames_received)

    peer = JsonRpcPeer(near, on_request=on_request, on_notification=on_notification)
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.serve)
        await far.send_all(
            b'{"jsonrpc":"2.0","id":1,"method":"work"}\n{"jsonrpc":"2.0","method":"cancel"}\n'
        )
        await trio.testing.wait_all_tasks_blocked()
        # The notification was handled before the request's task ran, yet the request's
        # arrival index still says it came first.
        assert notes == [2]
        assert arrivals == [1]
        await peer.aclose()


async def test_requests_read_before_end_of_input_are_answered() -> None:
    """A client may write its requests and close its side at once (a pipe); it still reads."""
    near, far = trio.testing.memory_stream_pair()

    async def on_request(method: str, params: Params) -> str:
        await trio.lowlevel.checkpoint()
        return f"done {method}"

    peer = JsonRpcPeer(near, on_request=on_request)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve)
        await far.send_all(
            b'{"jsonrpc":"2.0","id":1,"method":"a"}\n{"jsonrpc":"2.0","id":2,"method":"b"}\n'
        )
        await far.send_eof()
        received = b""
        while chunk := await far.receive_some(4096):
            received += chunk
    answers = [orjson.loads(line) for line in received.splitlines()]
    assert sorted((a["id"], a["result"]) for a in answers) == [(1, "done a"), (2, "done b")]


async def test_end_of_input_gives_long_handlers_only_a_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    near, far = trio.testing.memory_stream_pair()
    cancelled = trio.Event()

    async def on_request(method: str, params: Params) -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    peer = JsonRpcPeer(near, on_request=on_request)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve)
        await far.send_all(b'{"jsonrpc":"2.0","id":1,"method":"forever"}\n')
        await far.send_eof()
        start = trio.current_time()
        await cancelled.wait()
        assert trio.current_time() - start == pytest.approx(EOF_GRACE_S)
