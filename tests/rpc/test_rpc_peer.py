"""JsonRpcPeer over trio memory streams and real Unix socketpairs.

Each test drives the peer through the wire: either a second peer, or a raw stream end that
writes hand-made lines and reads what comes back.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from maple_acp.rpc import (
    MAX_CONCURRENT_REQUESTS,
    ConnectionClosed,
    JsonRpcPeer,
    OutboundFrameTooLarge,
    Params,
    encode_notification,
    method_not_found,
)
from maple_acp.wire.errors import ProtocolError

StreamPair = tuple[trio.abc.Stream, trio.abc.Stream]

#: Guard against hangs only; no test asserts how long anything took.
HANG_GUARD_SECONDS = 20


def memory_pair() -> StreamPair:
    return trio.testing.memory_stream_pair()


def lockstep_pair() -> StreamPair:
    return trio.testing.lockstep_stream_pair()


def socket_pair() -> StreamPair:
    left, right = socket.socketpair()
    return (
        trio.SocketStream(trio.socket.from_stdlib_socket(left)),
        trio.SocketStream(trio.socket.from_stdlib_socket(right)),
    )


@pytest.fixture(params=["memory", "socketpair"])
def make_pair(request: pytest.FixtureRequest) -> Callable[[], StreamPair]:
    return memory_pair if request.param == "memory" else socket_pair


class RawEnd:
    """The far side of a connection, spoken to byte by byte."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buffer = b""

    async def send(self, message: dict[str, Any] | bytes) -> None:
        if isinstance(message, dict):
            message = orjson.dumps(message) + b"\n"
        await self.stream.send_all(message)

    async def read_line(self) -> bytes | None:
        while b"\n" not in self._buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        assert b"\r" not in line
        return line

    async def read(self) -> dict[str, Any]:
        line = await self.read_line()
        assert line is not None, "the connection ended"
        message = orjson.loads(line)
        assert isinstance(message, dict)
        return message


@asynccontextmanager
async def serving(peer: JsonRpcPeer) -> AsyncIterator[JsonRpcPeer]:
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            yield peer
            await peer.aclose()


@asynccontextmanager
async def peer_and_raw(
    make_pair: Callable[[], StreamPair], **kwargs: Any
) -> AsyncIterator[tuple[JsonRpcPeer, RawEnd]]:
    ours, theirs = make_pair()
    async with serving(JsonRpcPeer(ours, **kwargs)) as peer:
        yield peer, RawEnd(theirs)
        await theirs.aclose()


def request_line(msg_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


async def echo_handler(method: str, params: Params) -> Any:
    if method == "echo":
        await trio.lowlevel.checkpoint()
        return params
    if method == "null":
        return None
    if method == "fail":
        raise ProtocolError(-32602, "bad value", {"field": "x"})
    if method == "crash":
        raise ValueError("secret-token-123 leaked into the exception text")
    if method == "unencodable":
        return {"value": object()}
    if method == "bad-data":
        raise ProtocolError(-32602, "bad value", {"field": object()})
    if method == "forever":
        await trio.sleep_forever()
    raise method_not_found(method)


# --- two peers ----------------------------------------------------------------------------


async def test_two_peers_call_each_other_concurrently(make_pair: Callable[[], StreamPair]) -> None:
    left_stream, right_stream = make_pair()
    left = JsonRpcPeer(left_stream, on_request=echo_handler)
    right = JsonRpcPeer(right_stream, on_request=echo_handler)
    results: dict[str, list[Any]] = {"left": [], "right": []}

    async def call(peer: JsonRpcPeer, side: str, index: int) -> None:
        results[side].append(await peer.request("echo", {"side": side, "i": index}))

    async with serving(left), serving(right), trio.open_nursery() as nursery:
        for index in range(50):
            nursery.start_soon(call, left, "left", index)
            nursery.start_soon(call, right, "right", index)
    for side in ("left", "right"):
        assert sorted(r["i"] for r in results[side]) == list(range(50))
        assert all(r["side"] == side for r in results[side])


async def test_result_null_error_answers_and_unknown_methods(
    make_pair: Callable[[], StreamPair],
) -> None:
    left_stream, right_stream = make_pair()
    left = JsonRpcPeer(left_stream)
    right = JsonRpcPeer(right_stream, on_request=echo_handler)
    async with serving(left), serving(right):
        assert await left.request("null") is None
        with pytest.raises(ProtocolError) as failed:
            await left.request("fail", {"x": 1})
        assert (failed.value.code, failed.value.message) == (-32602, "bad value")
        # The reason comes again in data.details, beside the handler's own keys.
        assert failed.value.data == {"field": "x", "details": "bad value"}
        with pytest.raises(ProtocolError) as unknown:
            await left.request("_vendor/unknown")
        assert unknown.value.code == -32601
        assert "_vendor/unknown" in unknown.value.message
        # A peer without a request handler answers every request -32601.
        with pytest.raises(ProtocolError) as no_handler:
            await right.request("echo", [1])
        assert no_handler.value.code == -32601


async def test_notifications_arrive_in_order_and_unknown_ones_are_ignored(
    make_pair: Callable[[], StreamPair],
) -> None:
    seen: list[tuple[str, Params]] = []
    done = trio.Event()

    async def on_notification(method: str, params: Params) -> None:
        if method == "boom":
            raise RuntimeError("notification handler bug")
        seen.append((method, params))
        if method == "last":
            done.set()

    left_stream, right_stream = make_pair()
    left = JsonRpcPeer(left_stream)
    right = JsonRpcPeer(right_stream, on_notification=on_notification, on_request=echo_handler)
    async with serving(left), serving(right):
        for index in range(200):
            await left.notify("tick", {"i": index})
        await left.notify("boom")
        await left.notify("last")
        await done.wait()
        assert [p for m, p in seen if m == "tick"] == [{"i": i} for i in range(200)]
        # A peer without on_notification ignores them and keeps serving.
        await right.notify("anything", {"a": 1})
        with pytest.raises(ProtocolError) as no_handler:
            await right.request("echo", [1])
        assert no_handler.value.code == -32601
        assert await left.request("echo", {"still": "usable"}) == {"still": "usable"}


# --- against a raw far end ----------------------------------------------------------------


async def test_outbound_lines_keep_strict_order_across_kinds(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair) as (peer, raw), trio.open_nursery() as nursery:
        for index in range(300):
            await peer.notify("n", {"i": index})
            if index == 150:
                nursery.start_soon(peer.request, "mid")
                # Let the request queue its line before the next notification.
                await trio.testing.wait_all_tasks_blocked()
        await peer.notify_encoded(b'{"jsonrpc":"2.0","method":"n","params":{"i":300}}\n')
        received = [await raw.read() for _ in range(302)]
        nursery.cancel_scope.cancel()
    numbers = [m["params"]["i"] for m in received if m["method"] == "n"]
    assert numbers == list(range(301))
    assert received[151]["method"] == "mid"


async def test_queued_lines_are_coalesced_into_few_writes() -> None:
    ours, theirs = memory_pair()
    writes: list[int] = []
    send_all = ours.send_all

    async def counting_send_all(data: bytes | bytearray | memoryview) -> None:
        writes.append(len(data))
        await send_all(data)

    ours.send_all = counting_send_all  # type: ignore[method-assign]
    async with serving(JsonRpcPeer(ours)) as peer:
        raw = RawEnd(theirs)
        for index in range(200):
            await peer.notify("n", {"i": index})
        await peer.drain()
        assert [(await raw.read())["params"]["i"] for _ in range(200)] == list(range(200))
    assert len(writes) <= 2
    assert all(size <= 64 * 1024 + 1024 for size in writes)


async def test_handler_crash_answers_internal_error_without_the_exception_text(
    make_pair: Callable[[], StreamPair], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="maple_acp.rpc")
    async with peer_and_raw(make_pair, on_request=echo_handler) as (_peer, raw):
        await raw.send(request_line(1, "crash"))
        answer = await raw.read()
        assert answer["id"] == 1
        assert answer["error"]["code"] == -32603
        assert answer["error"]["message"] == "internal error (ValueError)"
        assert "secret" not in orjson.dumps(answer).decode()
        await raw.send(request_line(2, "unencodable"))
        answer = await raw.read()
        assert (answer["id"], answer["error"]["code"]) == (2, -32603)
        await raw.send(request_line(3, "bad-data"))
        # The error stands; only its unencodable data is dropped (the reason stays in it).
        assert await raw.read() == {
            "jsonrpc": "2.0",
            "id": 3,
            "error": {"code": -32602, "message": "bad value", "data": {"details": "bad value"}},
        }
        await raw.send(request_line(4, "echo", {"ok": True}))
        assert await raw.read() == {"jsonrpc": "2.0", "id": 4, "result": {"ok": True}}
    crash_records = [r for r in caplog.records if r.exc_info and r.exc_info[0] is ValueError]
    assert crash_records, "the traceback must reach the log"


MALFORMED: list[tuple[bytes, int, Any]] = [
    (b"{not json", -32700, None),
    (b"\xff\xfe\xfd", -32700, None),
    (b"[]", -32600, None),
    (b'[{"jsonrpc":"2.0","id":1,"method":"echo"}]', -32600, None),
    (b"42", -32600, None),
    (b'{"id":5,"method":"echo"}', -32600, 5),
    (b'{"jsonrpc":"1.0","id":"s","method":"echo"}', -32600, "s"),
    (b'{"jsonrpc":"2.0","id":6,"method":6}', -32600, 6),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"echo"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":7,"method":"echo","params":"text"}', -32600, 7),
    (b'{"jsonrpc":"2.0","id":8,"result":1,"error":{"code":1,"message":"m"}}', -32600, None),
    (b'{"jsonrpc":"2.0"}', -32600, None),
]


@pytest.mark.parametrize(("line", "code", "reply_id"), MALFORMED)
async def test_each_malformed_line_is_answered_and_the_connection_goes_on(
    make_pair: Callable[[], StreamPair], line: bytes, code: int, reply_id: Any
) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler) as (_peer, raw):
        await raw.send(line + b"\r\n")
        answer = await raw.read()
        assert answer["error"]["code"] == code
        assert answer["id"] == reply_id
        message = answer["error"]["message"]
        assert message
        assert "\n" not in message
        assert len(message) <= 500
        await raw.send(request_line(100, "echo", {"after": True}))
        assert await raw.read() == {"jsonrpc": "2.0", "id": 100, "result": {"after": True}}


async def test_line_of_exactly_the_cap_is_served_and_one_byte_more_ends_the_connection(
    make_pair: Callable[[], StreamPair], caplog: pytest.LogCaptureFixture
) -> None:
    cap = 200
    head = b'{"jsonrpc":"2.0","id":1,"method":"echo","params":["'
    tail = b'"]}'
    exact = head + b"a" * (cap - len(head) - len(tail)) + tail
    assert len(exact) == cap
    ours, theirs = make_pair()
    peer = JsonRpcPeer(ours, on_request=echo_handler, max_line_bytes=cap)
    raw = RawEnd(theirs)
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await raw.send(exact + b"\r\n")
            assert (await raw.read())["result"] == ["a" * (cap - len(head) - len(tail))]
            too_long = exact.replace(b"[", b"[ ", 1)
            await raw.send(too_long + b"\n")
            # No answer: the peer hangs up, and serve returns by itself.
            assert await raw.read_line() is None
    assert peer.closed
    assert "exceeds 200 bytes" in peer.close_reason
    assert any(r.levelno == logging.WARNING and "exceeds" in r.getMessage() for r in caplog.records)


async def test_duplicate_in_flight_id_is_refused_but_the_first_still_answers(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler) as (_peer, raw):
        await raw.send(request_line(9, "forever"))
        await raw.send(request_line(9, "echo", [1]))
        answer = await raw.read()
        assert (answer["id"], answer["error"]["code"]) == (9, -32600)
        await raw.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 9}})
        answer = await raw.read()
        assert (answer["id"], answer["error"]["code"]) == (9, -32800)


async def test_too_many_concurrent_requests_are_refused_not_queued(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler, max_concurrent_requests=2) as (
        _peer,
        raw,
    ):
        await raw.send(request_line(1, "forever"))
        await raw.send(request_line(2, "forever"))
        await raw.send(request_line(3, "echo", [3]))
        answer = await raw.read()
        assert (answer["id"], answer["error"]["code"]) == (3, -32600)
        assert "at most 2 per connection" in answer["error"]["message"]
        await raw.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}})
        assert (await raw.read())["id"] == 1
        await raw.send(request_line(4, "echo", [4]))
        assert (await raw.read())["result"] == [4]


async def test_the_default_in_flight_cap_is_256_and_its_refusal_names_it(
    make_pair: Callable[[], StreamPair],
) -> None:
    # A client's flood is its own doing: -32600 naming the limit, never -32603 ("our bug").
    async with peer_and_raw(make_pair, on_request=echo_handler) as (_peer, raw):
        flood = [orjson.dumps(request_line(n, "forever")) for n in range(MAX_CONCURRENT_REQUESTS)]
        await raw.send(b"\n".join([*flood, orjson.dumps(request_line("one-more", "echo"))]) + b"\n")
        answer = await raw.read()
        assert answer["id"] == "one-more"
        assert answer["error"]["code"] == -32600
        assert f"at most {MAX_CONCURRENT_REQUESTS} per connection" in answer["error"]["message"]
        # The connection goes on: one in flight ends, and the next request is served.
        await raw.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 0}})
        assert (await raw.read())["id"] == 0
        await raw.send(request_line("after", "echo", [1]))
        assert await raw.read() == {"jsonrpc": "2.0", "id": "after", "result": [1]}


# --- $/cancel_request -----------------------------------------------------------------------


async def test_cancel_request_answers_minus_32800_exactly_once(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler) as (_peer, raw):
        await raw.send(request_line("slow", "forever"))
        await raw.send(
            {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "slow"}}
        )
        answer = await raw.read()
        assert answer["id"] == "slow"
        assert answer["error"]["code"] == -32800
        # Cancelling again, or an id never seen, changes nothing.
        for target in ("slow", 12345, None):
            await raw.send(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": target}}
            )
        await raw.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": [1]})
        await raw.send(request_line(2, "echo", ["next"]))
        assert await raw.read() == {"jsonrpc": "2.0", "id": 2, "result": ["next"]}


async def test_cancel_request_in_the_same_read_as_its_request(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler) as (_peer, raw):
        both = (
            orjson.dumps(request_line(None, "forever"))
            + b"\n"
            + orjson.dumps(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": None}}
            )
            + b"\n"
        )
        await raw.send(both)
        answer = await raw.read()
        assert answer["id"] is None
        assert answer["error"]["code"] == -32800


async def test_cancel_request_after_the_handler_finished_changes_nothing(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler) as (_peer, raw):
        await raw.send(request_line(7, "echo", {"v": 7}))
        assert await raw.read() == {"jsonrpc": "2.0", "id": 7, "result": {"v": 7}}
        await raw.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 7}})
        await raw.send(request_line(8, "echo", {"v": 8}))
        # The very next line answers 8: request 7 got exactly one answer.
        assert await raw.read() == {"jsonrpc": "2.0", "id": 8, "result": {"v": 8}}


async def test_a_handler_that_finishes_despite_cancellation_answers_its_result(
    make_pair: Callable[[], StreamPair],
) -> None:
    started = trio.Event()
    release = trio.Event()

    async def stubborn(method: str, params: Params) -> Any:
        with trio.CancelScope(shield=True):
            started.set()
            await release.wait()
        return "finished anyway"

    async with peer_and_raw(make_pair, on_request=stubborn) as (_peer, raw):
        await raw.send(request_line(1, "work"))
        await started.wait()
        await raw.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}})
        await trio.testing.wait_all_tasks_blocked()
        release.set()
        assert await raw.read() == {"jsonrpc": "2.0", "id": 1, "result": "finished anyway"}


async def test_a_handler_that_returns_without_checkpointing_keeps_its_result() -> None:
    async def instant(method: str, params: Params) -> Any:
        return "done"

    async with peer_and_raw(memory_pair, on_request=instant) as (_peer, raw):
        both = (
            orjson.dumps(request_line(1, "x"))
            + b"\n"
            + orjson.dumps(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}}
            )
            + b"\n"
        )
        await raw.send(both)
        # The cancellation was requested but never took effect: the result is the answer.
        assert await raw.read() == {"jsonrpc": "2.0", "id": 1, "result": "done"}
        await raw.send(request_line(2, "x"))
        assert (await raw.read())["id"] == 2


# --- outgoing requests: cancellation, late answers, EOF ----------------------------------


async def test_local_cancellation_forgets_the_request_and_drops_the_late_answer(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="maple_acp.rpc")
    async with peer_and_raw(memory_pair) as (peer, raw):
        with trio.move_on_after(5) as timeout:
            await peer.request("session/request_permission", {"q": 1})
        assert timeout.cancelled_caught
        sent = await raw.read()
        # The late answer is dropped quietly; the next request correlates correctly.
        await raw.send({"jsonrpc": "2.0", "id": sent["id"], "result": "late"})
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def ask() -> None:
                results.append(await peer.request("second"))

            nursery.start_soon(ask)
            second = await raw.read()
            assert second["id"] != sent["id"]
            await raw.send({"jsonrpc": "2.0", "id": second["id"], "result": "fresh"})
        assert results == ["fresh"]
    assert any("abandoned" in r.getMessage() for r in caplog.records)
    assert any("dropping an answer" in r.getMessage() for r in caplog.records)


async def test_eof_fails_every_pending_request_at_once(
    make_pair: Callable[[], StreamPair],
) -> None:
    ours, theirs = make_pair()
    peer = JsonRpcPeer(ours)
    raw = RawEnd(theirs)
    failures: list[BaseException] = []

    async def ask(index: int) -> None:
        try:
            await peer.request("wait", {"i": index})
        except ConnectionClosed as exc:
            failures.append(exc)

    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            for index in range(3):
                nursery.start_soon(ask, index)
            for _ in range(3):
                await raw.read()
            await theirs.aclose()
    assert len(failures) == 3
    assert peer.closed
    with pytest.raises(ConnectionClosed):
        await peer.request("after")
    with pytest.raises(ConnectionClosed):
        await peer.notify("after")


async def test_transport_end_cancels_inbound_handlers_and_serve_returns(
    make_pair: Callable[[], StreamPair], autojump_clock: trio.testing.MockClock
) -> None:
    cancelled = trio.Event()

    async def handler(method: str, params: Params) -> Any:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    ours, theirs = make_pair()
    peer = JsonRpcPeer(ours, on_request=handler)
    raw = RawEnd(theirs)
    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            await raw.send(request_line(1, "long"))
            await trio.testing.wait_all_tasks_blocked()
            await theirs.aclose()
    assert cancelled.is_set()


async def test_an_error_answer_without_a_usable_shape_fails_its_request() -> None:
    async with peer_and_raw(memory_pair) as (peer, raw), trio.open_nursery() as nursery:
        outcome: list[BaseException] = []

        async def ask() -> None:
            try:
                await peer.request("m")
            except ProtocolError as exc:
                outcome.append(exc)

        nursery.start_soon(ask)
        sent = await raw.read()
        await raw.send({"jsonrpc": "2.0", "id": sent["id"], "error": {"code": "bad"}})
        reply = await raw.read()  # the peer tells the far end it sent garbage
        assert (reply["id"], reply["error"]["code"]) == (None, -32600)
    assert len(outcome) == 1
    assert outcome[0].code == -32600  # type: ignore[attr-defined]


async def test_aclose_fails_pending_requests_and_serve_returns() -> None:
    ours, _theirs = memory_pair()
    peer = JsonRpcPeer(ours)
    failures: list[BaseException] = []

    async def ask() -> None:
        with pytest.raises(ConnectionClosed) as info:
            await peer.request("never answered")
        failures.append(info.value)

    with trio.fail_after(HANG_GUARD_SECONDS):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            await peer.aclose()
            await peer.aclose()
    assert len(failures) == 1
    with pytest.raises(RuntimeError):
        await peer.serve()


# --- credit and backpressure --------------------------------------------------------------


async def test_a_stalled_reader_blocks_notify_until_it_reads_lockstep() -> None:
    ours, theirs = lockstep_pair()
    await check_backpressure(ours, theirs, total=40)


async def test_a_stalled_reader_blocks_notify_until_it_reads_socketpair() -> None:
    ours, theirs = socket_pair()
    # Enough data to fill the kernel's socket buffers, so credit becomes the limit.
    await check_backpressure(ours, theirs, total=3000, text_size=2000)


async def check_backpressure(
    ours: trio.abc.Stream, theirs: trio.abc.Stream, total: int, text_size: int = 10
) -> None:
    peer = JsonRpcPeer(ours, max_outbound_lines=4, max_outbound_bytes=1 << 20)
    sent = 0

    async def produce() -> None:
        nonlocal sent
        for index in range(total):
            await peer.notify("n", {"i": index, "t": "x" * text_size})
            sent += 1

    raw = RawEnd(theirs)
    async with serving(peer), trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        await trio.testing.wait_all_tasks_blocked()
        stalled_at = sent
        assert stalled_at < total, "notify must wait once credit is spent"
        assert peer.credit.lines_in_use == 4
        await trio.testing.wait_all_tasks_blocked()
        assert sent == stalled_at
        numbers = [(await raw.read())["params"]["i"] for _ in range(total)]
    assert numbers == list(range(total))
    assert sent == total


async def test_credit_returns_only_after_the_line_is_written() -> None:
    ours, theirs = lockstep_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours, max_outbound_lines=2)) as peer:
        line = b'{"jsonrpc":"2.0","method":"n"}\n'
        await peer.notify_encoded(line)
        await trio.testing.wait_all_tasks_blocked()
        # The writer holds the line in send_all; nobody has read it.
        assert peer.credit.lines_in_use == 1
        assert peer.credit.bytes_in_use == len(line) + 256
        assert await raw.read() == {"jsonrpc": "2.0", "method": "n"}
        await trio.testing.wait_all_tasks_blocked()
        assert peer.credit.lines_in_use == 0
        assert peer.credit.bytes_in_use == 0


async def test_a_held_request_keeps_its_credit_until_answered() -> None:
    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours, max_outbound_lines=2)) as peer:
        async with trio.open_nursery() as nursery:
            answer: list[Any] = []

            async def ask() -> None:
                answer.append(await peer.request("perm", {"a": 1}, hold_credit=True))

            nursery.start_soon(ask)
            sent = await raw.read()
            await peer.drain()
            assert peer.credit.lines_in_use == 1
            await peer.notify("n")
            # One line for the held request, one for the update: the budget is spent.
            blocked = trio.Event()

            async def third() -> None:
                blocked.set()
                await peer.notify("after")

            await peer.drain()
            nursery.start_soon(third)
            await blocked.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert (await raw.read())["method"] == "n"
            await raw.send({"jsonrpc": "2.0", "id": sent["id"], "result": {"outcome": "ok"}})
            assert (await raw.read())["method"] == "after"
        assert answer == [{"outcome": "ok"}]
        await peer.drain()
        assert peer.credit.lines_in_use == 0


async def test_a_cancelled_held_request_gives_its_credit_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ours, _theirs = memory_pair()
    async with serving(JsonRpcPeer(ours)) as peer:
        with trio.move_on_after(5):
            await peer.request("perm", hold_credit=True)
        await peer.drain()
        assert peer.credit.lines_in_use == 0


async def test_an_oversize_frame_is_refused_and_the_connection_goes_on(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair, max_outbound_bytes=2000) as (peer, raw):
        with pytest.raises(OutboundFrameTooLarge):
            await peer.notify("big", {"t": "x" * 2000})
        with pytest.raises(OutboundFrameTooLarge):
            await peer.request("big", {"t": "x" * 2000})
        await peer.notify("small")
        assert (await raw.read())["method"] == "small"
        assert peer.credit.lines_in_use <= 1


async def test_an_oversize_answer_becomes_an_internal_error(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler, max_outbound_bytes=2000) as (
        _peer,
        raw,
    ):
        await raw.send(request_line(1, "echo", {"t": "x" * 1900}))
        answer = await raw.read()
        assert (answer["id"], answer["error"]["code"]) == (1, -32603)


async def test_notify_encoded_refuses_a_frame_with_an_inner_newline() -> None:
    ours, _theirs = memory_pair()
    async with serving(JsonRpcPeer(ours)) as peer:
        with pytest.raises(ValueError, match="newline"):
            await peer.notify_encoded(b'{"a":1}\n{"b":2}\n')
        with pytest.raises(ValueError, match="newline"):
            await peer.notify_encoded(b'{"a":1}')
        assert peer.credit.lines_in_use == 0


async def test_drain_returns_only_once_earlier_lines_are_written() -> None:
    ours, theirs = lockstep_pair()
    drained = trio.Event()
    async with serving(JsonRpcPeer(ours)) as peer, trio.open_nursery() as nursery:
        expected = b""
        for index in range(20):
            await peer.notify("n", {"i": index, "t": "x" * 5000})
            expected += encode_notification("n", {"i": index, "t": "x" * 5000})

        async def wait_drain() -> None:
            await peer.drain()
            drained.set()

        nursery.start_soon(wait_drain)
        received = b""
        # Read everything but the very last byte, in small pieces.
        while len(received) < len(expected) - 1:
            received += await theirs.receive_some(min(4096, len(expected) - 1 - len(received)))
            await trio.testing.wait_all_tasks_blocked()
            assert not drained.is_set()
        received += await theirs.receive_some(1)
        assert received == expected
        await drained.wait()
        # Nothing queued: returns at once.
        await peer.drain()


async def test_drain_fails_if_the_connection_ends_first() -> None:
    ours, theirs = lockstep_pair()
    async with serving(JsonRpcPeer(ours)) as peer:
        await peer.notify("n")
        async with trio.open_nursery() as nursery:

            async def close_soon() -> None:
                await trio.testing.wait_all_tasks_blocked()
                await theirs.aclose()

            nursery.start_soon(close_soon)
            with pytest.raises(ConnectionClosed):
                await peer.drain()


async def test_a_cancelled_credit_wait_takes_nothing_and_lets_later_senders_through() -> None:
    ours, theirs = lockstep_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours, max_outbound_lines=1)) as peer:
        await peer.notify("first")
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as nursery:
            cancelled_wait = trio.CancelScope()
            outcomes: list[str] = []

            async def second() -> None:
                with cancelled_wait:
                    await peer.notify("second")
                    outcomes.append("second sent")
                outcomes.append("second done")

            async def third() -> None:
                await peer.notify("third")
                outcomes.append("third sent")

            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(third)
            await trio.testing.wait_all_tasks_blocked()
            assert outcomes == []
            cancelled_wait.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert outcomes == ["second done"]
            assert (await raw.read())["method"] == "first"
            assert (await raw.read())["method"] == "third"
        assert outcomes == ["second done", "third sent"]
        await peer.drain()
        assert peer.credit.lines_in_use == 0


async def test_a_large_frame_at_the_head_is_not_starved_by_small_ones() -> None:
    ours, theirs = lockstep_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours, max_outbound_bytes=3000)) as peer:
        await peer.notify("filler", {"t": "x" * 1500})
        await trio.testing.wait_all_tasks_blocked()
        order: list[str] = []
        async with trio.open_nursery() as nursery:

            async def send(name: str, size: int) -> None:
                await peer.notify(name, {"t": "x" * size})
                order.append(name)

            nursery.start_soon(send, "large", 2000)
            await trio.testing.wait_all_tasks_blocked()
            # "small" fits beside "filler" but not beside "large".
            nursery.start_soon(send, "small", 700)
            await trio.testing.wait_all_tasks_blocked()
            # It would fit now, but it queued behind "large".
            assert order == []
            methods = [(await raw.read())["method"] for _ in range(3)]
        assert methods == ["filler", "large", "small"]
        assert order == ["large", "small"]


async def test_a_request_cancelled_while_waiting_for_credit_leaves_no_pending_entry() -> None:
    ours, theirs = lockstep_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours, max_outbound_lines=1)) as peer:
        await peer.notify("first")
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await peer.request("never sent")
        assert (await raw.read())["method"] == "first"
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def ask() -> None:
                results.append(await peer.request("sent"))

            nursery.start_soon(ask)
            sent = await raw.read()
            assert sent["method"] == "sent"
            await raw.send({"jsonrpc": "2.0", "id": sent["id"], "result": [1]})
        assert results == [[1]]


async def test_an_abandoned_request_can_tell_the_other_side(
    make_pair: Callable[[], StreamPair],
) -> None:
    async with peer_and_raw(make_pair) as (peer, raw):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def ask() -> None:
                    await peer.request("slow", cancel_remote=True)

                nursery.start_soon(ask)
                sent = await raw.read()
                scope.cancel()
        notice = await raw.read()
        assert notice == {
            "jsonrpc": "2.0",
            "method": "$/cancel_request",
            "params": {"requestId": sent["id"]},
        }
        # Credit was not taken for the notice, and the request's own was given back.
        await peer.drain()
        assert peer.credit.lines_in_use == 0


async def test_two_peers_cancel_across_the_wire() -> None:
    started = trio.Event()
    handler_cancelled = trio.Event()

    async def slow(method: str, params: Params) -> Any:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            handler_cancelled.set()

    left_stream, right_stream = socket_pair()
    left = JsonRpcPeer(left_stream)
    right = JsonRpcPeer(right_stream, on_request=slow)
    async with serving(left), serving(right):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(left.request, "work", cancel_remote=True))
                await started.wait()
                scope.cancel()
        await handler_cancelled.wait()
        # Its -32800 answer reaches a caller that is gone and is dropped; both stay usable.
        with pytest.raises(ProtocolError) as unknown:
            await right.request("anything")
        assert unknown.value.code == -32601


async def test_answers_nobody_asked_for_get_no_reply(make_pair: Callable[[], StreamPair]) -> None:
    async with peer_and_raw(make_pair, on_request=echo_handler) as (peer, raw):
        # An error about our own output, answers to ids never sent, or sent as strings:
        # none of them may provoke a reply, or two peers could echo errors forever.
        await raw.send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "x"}})
        await raw.send({"jsonrpc": "2.0", "id": 999, "result": None})
        await raw.send({"jsonrpc": "2.0", "id": "1", "error": {"code": 1, "message": "m"}})
        await raw.send(request_line(5, "echo", ["next"]))
        assert await raw.read() == {"jsonrpc": "2.0", "id": 5, "result": ["next"]}
        assert not peer.closed


# --- batches of pre-encoded lines ----------------------------------------------------------------


def _line(index: int) -> bytes:
    return b'{"jsonrpc":"2.0","method":"n","params":{"i":%d}}\n' % index


async def test_a_batch_of_lines_arrives_whole_and_in_order_past_the_credit_budget() -> None:
    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours, max_outbound_lines=4)) as peer:
        async with trio.open_nursery() as nursery:
            # Ten lines through a budget of four: the batch waits for credit part way and
            # hands what it queued to the writer first, or it would wait forever.
            nursery.start_soon(peer.notify_lines, [_line(i) for i in range(10)])
            received = [await raw.read() for _ in range(10)]
        assert [m["params"]["i"] for m in received] == list(range(10))
        await trio.testing.wait_all_tasks_blocked()
        assert peer.credit.lines_in_use == 0


async def test_a_batch_with_a_bad_line_queues_nothing() -> None:
    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours)) as peer:
        with pytest.raises(ValueError, match="newline"):
            await peer.notify_lines([_line(0), b'{"a":\n1}\n'])
        with pytest.raises(ValueError, match="empty"):
            await peer.notify_lines([_line(0), b""])
        await peer.notify_lines([_line(7)])
        assert (await raw.read())["params"]["i"] == 7


async def test_a_batch_on_a_closed_connection_raises_connection_closed() -> None:
    ours, _theirs = memory_pair()
    async with serving(JsonRpcPeer(ours)) as peer:
        await peer.aclose()
        with pytest.raises(ConnectionClosed):
            await peer.notify_lines([_line(0)])
        with pytest.raises(ConnectionClosed):
            await peer.notify_encoded(_line(0))
