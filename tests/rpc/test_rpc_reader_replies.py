"""The reading task never waits on the writer: the replies it owes itself (a parse error, a
refused request) are queued at once, from the shared credit or a small reserve of their own,
even while held requests have spent every bit of the shared credit."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from test_rpc_peer import RawEnd, lockstep_pair, memory_pair, request_line, serving

from maple_acp.rpc import REPLY_RESERVE_LINES, JsonRpcPeer, Params, parse_message
from maple_acp.rpc._envelope import InvalidMessage
from maple_acp.wire import INVALID_REQUEST

#: The line of the review that wedged a connection: a request cut short.
CUT_SHORT = b'{"jsonrpc": "2.0", "id": 99, "method":\n'


async def forever(method: str, params: Params) -> Any:
    await trio.sleep_forever()


async def _fill_the_credit_with_held_requests(
    peer: JsonRpcPeer, raw: RawEnd, nursery: trio.Nursery, results: list[Any]
) -> list[int]:
    """Two held requests spend the whole two-line budget and a notification waits behind
    them; returns the requests' ids as the other side saw them."""

    async def ask(index: int) -> None:
        results.append(await peer.request("perm", {"i": index}, hold_credit=True))

    nursery.start_soon(ask, 0)
    nursery.start_soon(ask, 1)
    ids = [(await raw.read())["id"] for _ in range(2)]
    nursery.start_soon(peer.notify, "after")
    await trio.testing.wait_all_tasks_blocked()
    assert peer.credit.lines_in_use == 2
    return ids


@pytest.mark.parametrize(
    ("line", "code", "reply_id"),
    [
        (CUT_SHORT, -32700, None),
        (b'{"jsonrpc": "2.0", "id": 7, "method": 7}\n', -32600, 7),
        # The handler below never returns, so a second request with its id is refused.
        (orjson.dumps(request_line(5, "busy")) + b"\n", -32600, 5),
    ],
    ids=["parse-error", "invalid-request", "duplicate-id"],
)
async def test_the_reader_answers_faults_while_held_requests_spend_the_credit(
    autojump_clock: trio.testing.MockClock, line: bytes, code: int, reply_id: Any
) -> None:
    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    results: list[Any] = []
    peer = JsonRpcPeer(ours, on_request=forever, max_outbound_lines=2)
    async with serving(peer), trio.open_nursery() as nursery:
        await raw.send(request_line(5, "busy"))
        ids = await _fill_the_credit_with_held_requests(peer, raw, nursery, results)
        await raw.send(line)
        reply = await raw.read()
        assert reply["id"] == reply_id
        assert reply["error"]["code"] == code
        # The reader goes on: the answers free the credit and the waiting line goes out.
        for msg_id in ids:
            await raw.send({"jsonrpc": "2.0", "id": msg_id, "result": {"ok": msg_id}})
        assert (await raw.read())["method"] == "after"
        nursery.cancel_scope.cancel()
    assert sorted(r["ok"] for r in results) == sorted(ids)


async def test_too_many_requests_are_refused_while_the_credit_is_spent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    results: list[Any] = []
    peer = JsonRpcPeer(ours, on_request=forever, max_outbound_lines=2, max_concurrent_requests=1)
    async with serving(peer), trio.open_nursery() as nursery:
        await raw.send(request_line(1, "busy"))
        await _fill_the_credit_with_held_requests(peer, raw, nursery, results)
        await raw.send(request_line(2, "busy"))
        reply = await raw.read()
        assert reply["id"] == 2
        assert reply["error"]["code"] == -32600
        assert reply["error"]["data"] == {"details": reply["error"]["message"]}
        nursery.cancel_scope.cancel()


async def test_a_peer_that_sends_faults_and_never_reads_is_disconnected(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer is stuck (nobody reads), the shared credit is spent: the reserve takes the
    replies to the first faults, and one more ends the connection instead of the reader
    waiting."""
    caplog.set_level(logging.WARNING, logger="maple_acp.rpc")
    ours, theirs = lockstep_pair()
    raw = RawEnd(theirs)
    peer = JsonRpcPeer(ours, max_outbound_lines=1)
    async with serving(peer):
        await peer.notify("stuck")
        await raw.send(CUT_SHORT * REPLY_RESERVE_LINES)
        await trio.testing.wait_all_tasks_blocked()
        assert not peer.closed
        await raw.send(CUT_SHORT)
        await trio.testing.wait_all_tasks_blocked()
        assert peer.closed
    assert "faulty messages without reading" in peer.close_reason
    assert any("faulty messages without reading" in r.getMessage() for r in caplog.records)


async def test_the_reserve_is_given_back_once_its_replies_are_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    results: list[Any] = []
    peer = JsonRpcPeer(ours, max_outbound_lines=2)
    async with serving(peer), trio.open_nursery() as nursery:
        await _fill_the_credit_with_held_requests(peer, raw, nursery, results)
        # Twice the reserve, one reserve's worth at a time: each batch is written (and read)
        # before the next, so the connection goes on.
        for _ in range(2):
            await raw.send(CUT_SHORT * REPLY_RESERVE_LINES)
            for _ in range(REPLY_RESERVE_LINES):
                assert (await raw.read())["error"]["code"] == -32700
        assert not peer.closed
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("line", "reply_id"),
    [(b'{"id": 5}', 5), (b'{"id": "x", "params": {}}', "x"), (b"{}", None), (b'{"id": 1.5}', None)],
)
def test_an_object_with_no_jsonrpc_method_or_answer_is_an_invalid_request(
    line: bytes, reply_id: Any
) -> None:
    parsed = parse_message(line)
    assert isinstance(parsed, InvalidMessage)
    assert parsed.reply.code == INVALID_REQUEST
    assert parsed.reply.message.startswith("invalid request")
    assert parsed.reply.id == reply_id
    assert parsed.response_id is None


async def test_an_object_without_jsonrpc_is_logged_and_answered_as_an_invalid_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="maple_acp.rpc")
    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours)):
        await raw.send(b'{"id": 5, "params": {}}\n')
        reply = await raw.read()
    assert reply["id"] == 5
    assert reply["error"]["code"] == -32600
    faults = [r.getMessage() for r in caplog.records if "malformed message" in r.getMessage()]
    assert faults == ['answering a malformed message: invalid request: "jsonrpc" must be "2.0"']


async def test_error_answers_to_notifications_are_told_once_per_kind_in_a_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that answers every update it does not know with a long error (Toad does): the
    first of each code on a connection is one INFO line of at most 160 characters (200 with
    the log prefix), the repeats are DEBUG; the connection goes on."""
    caplog.set_level(logging.DEBUG, logger="maple_acp.rpc")
    long_text = "Parameter is not the expected type (dict[str, JSONType]);\n" + "x" * 500

    def error(code: int) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": long_text}}

    async def echo(method: str, params: Params) -> Any:
        return {"method": method}

    ours, theirs = memory_pair()
    raw = RawEnd(theirs)
    async with serving(JsonRpcPeer(ours, on_request=echo)):
        for code in (-32602, -32602, -32602, -32601, -32602):
            await raw.send(error(code))
        await raw.send(request_line(7, "still"))
        assert (await raw.read())["result"] == {"method": "still"}
    told = [r for r in caplog.records if "answered a notification" in r.getMessage()]
    assert [r.levelno for r in told] == [
        logging.INFO,
        logging.DEBUG,
        logging.DEBUG,
        logging.INFO,
        logging.DEBUG,
    ]
    for record in told:
        line = record.getMessage()
        assert len(line) <= 160
        assert "\n" not in line
    assert "error -32601" in told[3].getMessage()
