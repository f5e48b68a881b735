"""JSON-RPC batches: ``split_batch`` (sans-I/O: a batch line's members, classified, or one
refusal for an empty, oversized or unparseable batch) and the peer's one array answer over a
real socket pair (every member's id echoed exactly, malformed members answered inside it)."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import trio

from maple_acp.rpc import (
    MAX_BATCH_MESSAGES,
    InvalidMessage,
    JsonRpcPeer,
    Notification,
    Params,
    Request,
    after_answer,
    method_not_found,
    split_batch,
)

#: Ids orjson cannot hold as integers: just past 64 bits, past a double's precision and range.
BIG_IDS = (2**64 + 7, -(2**63) - 1, 10**30 + 1, int("9" * 400))
HANG_GUARD_S = 10


def request(msg_id: Any, method: str = "echo", params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def batch_line(members: list[Any]) -> bytes:
    # The standard library writes integers of any size, as a client would.
    return json.dumps(members).encode()


# --- split_batch --------------------------------------------------------------------------


def test_a_line_that_is_not_an_array_is_not_a_batch() -> None:
    assert split_batch(b'{"jsonrpc": "2.0", "method": "x"}') is None
    assert split_batch(b"  7") is None


def test_members_are_classified_in_order() -> None:
    members = [request(n, "m") for n in range(3)] + [{"jsonrpc": "2.0", "method": "n"}, 1, []]
    parsed = split_batch(b"  " + orjson.dumps(members))
    assert isinstance(parsed, list)
    assert parsed[:4] == [Request(0, "m"), Request(1, "m"), Request(2, "m"), Notification("n")]
    # A member that is not an object, or an array (no batch inside a batch), is malformed.
    assert all(isinstance(p, InvalidMessage) and p.reply.code == -32600 for p in parsed[4:])


def test_empty_oversized_and_broken_batches_are_one_refusal() -> None:
    too_many = orjson.dumps([{"jsonrpc": "2.0", "method": "m"}] * (MAX_BATCH_MESSAGES + 1))
    for line, code in ((b"[]", -32600), (too_many, -32600), (b"[1, ", -32700)):
        refused = split_batch(line)
        assert isinstance(refused, InvalidMessage)
        assert refused.reply.code == code
        assert refused.reply.id is None
    assert isinstance(split_batch(orjson.dumps([0] * MAX_BATCH_MESSAGES)), list)


@pytest.mark.parametrize("big", BIG_IDS)
def test_every_integer_id_is_exact_whatever_its_size(big: int) -> None:
    parsed = split_batch(batch_line([request(big), request(2), request(big - 1, "other")]))
    assert parsed == [Request(big, "echo"), Request(2, "echo"), Request(big - 1, "other")]


def test_a_fractional_or_overflowing_id_is_refused_on_its_own() -> None:
    line = b'[{"jsonrpc":"2.0","id":1.5,"method":"m"},{"jsonrpc":"2.0","id":1e400,"method":"m"},'
    line += b'{"jsonrpc":"2.0","id":' + b"9" * 400 + b',"method":"m"}]'
    parsed = split_batch(line)
    assert isinstance(parsed, list)
    assert [type(p) for p in parsed] == [InvalidMessage, InvalidMessage, Request]
    assert all(p.reply.code == -32600 for p in parsed[:2] if isinstance(p, InvalidMessage))
    assert parsed[2] == Request(int("9" * 400), "m")


def test_a_member_with_a_huge_number_outside_its_id_is_refused_with_its_id() -> None:
    line = batch_line([request(7, "m", {"n": 10**400}), request(8, "m")])
    parsed = split_batch(line)
    assert isinstance(parsed, list)
    refused, kept = parsed
    assert isinstance(refused, InvalidMessage)
    assert (refused.reply.code, refused.reply.id) == (-32600, 7)
    assert kept == Request(8, "m")


# --- the peer's one answer ----------------------------------------------------------------


class Far:
    """The client end of a socket pair, spoken to in raw lines."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, line: bytes) -> None:
        await self.stream.send_all(line + b"\n")

    async def line(self) -> bytes:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            assert data, "the connection ended"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


async def handler(method: str, params: Params) -> Any:
    if method == "echo":
        await trio.lowlevel.checkpoint()
        return params
    if method == "slow":
        await trio.sleep(0.05)
        return "slow"
    if method == "big":
        return "x" * 3000
    if method == "forever":
        await trio.sleep_forever()
    raise method_not_found(method)


@asynccontextmanager
async def batch_peer(**options: Any) -> AsyncIterator[Far]:
    ours, theirs = socket.socketpair()

    async def on_request(method: str, params: Params) -> Any:
        if method != "then-notify":
            return await handler(method, params)

        async def note() -> None:
            await peer.notify("after", {"n": 1})

        after_answer(note)
        return "first"

    peer = JsonRpcPeer(
        trio.SocketStream(trio.socket.from_stdlib_socket(ours)), on_request=on_request, **options
    )
    peer.accept_batches = True
    far = Far(trio.SocketStream(trio.socket.from_stdlib_socket(theirs)))
    with trio.fail_after(HANG_GUARD_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            yield far
            await peer.aclose()
            await far.stream.aclose()


def decode(line: bytes) -> Any:
    return json.loads(line)


async def test_a_batch_is_answered_by_one_array_once_every_member_is_done() -> None:
    async with batch_peer() as far:
        members = [request("slow", "slow"), request(1, "echo", [1]), request("nope", "nope")]
        await far.send(batch_line(members))
        answer = decode(await far.line())
        assert answer == [
            {"jsonrpc": "2.0", "id": "slow", "result": "slow"},
            {"jsonrpc": "2.0", "id": 1, "result": [1]},
            {
                "jsonrpc": "2.0",
                "id": "nope",
                "error": {
                    "code": -32601,
                    "message": "method not found: nope",
                    "data": {"details": "method not found: nope"},
                },
            },
        ]
        # Nothing else came, and the connection goes on.
        await far.send(orjson.dumps(request(2, "echo", [2])))
        assert decode(await far.line()) == {"jsonrpc": "2.0", "id": 2, "result": [2]}


async def test_big_integer_ids_are_echoed_exactly_in_the_array() -> None:
    async with batch_peer() as far:
        await far.send(batch_line([request(big, "echo", [n]) for n, big in enumerate(BIG_IDS)]))
        raw = await far.line()
        answer = decode(raw)
        assert [member["id"] for member in answer] == list(BIG_IDS)
        assert [member["result"] for member in answer] == [[n] for n in range(len(BIG_IDS))]
        assert str(BIG_IDS[-1]).encode() in raw


async def test_malformed_members_are_answered_inside_the_array_and_the_others_run() -> None:
    async with batch_peer() as far:
        line = (
            b'[1, {"jsonrpc": "2.0"}, {"jsonrpc": "1.0", "id": 5, "method": "echo"}, '
            b'{"jsonrpc": "2.0", "id": 6, "method": "echo", "params": [6]}, '
            b'{"jsonrpc": "2.0", "method": "a-notification"}]'
        )
        await far.send(line)
        answer = decode(await far.line())
        assert [(m["id"], m.get("error", {}).get("code")) for m in answer] == [
            (None, -32600),
            (None, -32600),
            (5, -32600),
            (6, None),
        ]
        assert answer[3]["result"] == [6]


async def test_a_batch_of_notifications_only_is_answered_with_nothing() -> None:
    async with batch_peer() as far:
        await far.send(batch_line([{"jsonrpc": "2.0", "method": "n"}] * 3))
        await far.send(orjson.dumps(request("after", "echo", [1])))
        assert decode(await far.line())["id"] == "after"


async def test_a_batch_of_refusals_only_is_answered_at_once() -> None:
    async with batch_peer() as far:
        await far.send(b'[1, "two", []]')
        answer = decode(await far.line())
        assert [m["error"]["code"] for m in answer] == [-32600, -32600, -32600]


async def test_a_cancelled_member_answers_minus_32800_inside_the_array() -> None:
    async with batch_peer() as far:
        await far.send(batch_line([request("stuck", "forever"), request(1, "echo", [1])]))
        cancel = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "stuck"}}
        await far.send(orjson.dumps(cancel))
        answer = decode(await far.line())
        assert answer[0]["id"] == "stuck"
        assert answer[0]["error"]["code"] == -32800
        assert answer[1] == {"jsonrpc": "2.0", "id": 1, "result": [1]}


async def test_a_members_follow_ups_go_after_the_array() -> None:
    async with batch_peer() as far:
        await far.send(batch_line([request(1, "then-notify"), request(2, "slow")]))
        first = decode(await far.line())
        assert [m["id"] for m in first] == [1, 2]
        assert decode(await far.line())["method"] == "after"


async def test_an_array_too_large_for_the_budget_cuts_its_largest_answers() -> None:
    # 3 answers of ~3 KB do not fit a 6 KB budget together: the largest become -32603.
    async with batch_peer(max_outbound_bytes=6000) as far:
        await far.send(batch_line([request(n, "big") for n in range(3)] + [request(9, "echo")]))
        answer = decode(await far.line())
        assert [m["id"] for m in answer] == [0, 1, 2, 9]
        codes = [m.get("error", {}).get("code") for m in answer]
        assert codes.count(-32603) >= 1
        assert codes[-1] is None
        await far.send(orjson.dumps(request("after", "echo", [1])))
        assert decode(await far.line())["id"] == "after"


@pytest.mark.parametrize("big", BIG_IDS)
async def test_a_single_request_with_a_huge_id_is_echoed_exactly(big: int) -> None:
    async with batch_peer() as far:
        await far.send(batch_line([request(big, "echo", [1])])[1:-1])
        assert decode(await far.line()) == {"jsonrpc": "2.0", "id": big, "result": [1]}
