"""``split_batch``: a batch line's members, or one refusal for an empty, oversized or
unparseable batch (sans-I/O; the peer's use of it is tested over a v2 connection)."""

from __future__ import annotations

import orjson

from maple_acp.rpc import MAX_BATCH_MESSAGES, InvalidMessage, split_batch


def test_a_line_that_is_not_an_array_is_not_a_batch() -> None:
    assert split_batch(b'{"jsonrpc": "2.0", "method": "x"}') is None
    assert split_batch(b"  7") is None


def test_members_become_lines_of_their_own_in_order() -> None:
    members = [{"jsonrpc": "2.0", "id": n, "method": "m"} for n in range(3)] + [1, []]
    lines = split_batch(b"  " + orjson.dumps(members))
    assert isinstance(lines, list)
    assert [orjson.loads(line) for line in lines] == members


def test_empty_oversized_and_broken_batches_are_one_refusal() -> None:
    too_many = orjson.dumps([{"jsonrpc": "2.0", "method": "m"}] * (MAX_BATCH_MESSAGES + 1))
    for line, code in ((b"[]", -32600), (too_many, -32600), (b"[1, ", -32700)):
        refused = split_batch(line)
        assert isinstance(refused, InvalidMessage)
        assert refused.reply.code == code
        assert refused.reply.id is None
    assert isinstance(split_batch(orjson.dumps([0] * MAX_BATCH_MESSAGES)), list)
