"""The network channel routes messages by the route the peer hands it, never by reading them;
the SSE stream's ASCII escaping gives the same JSON value, byte for byte what a dump with
``ensure_ascii`` writes."""

from __future__ import annotations

import json

import orjson
import pytest
import trio

from maple_acp.net._channel import AnswerCapture, NetworkChannel
from maple_acp.net._http import _ascii


def pending(stream: object) -> list[bytes]:
    return [line for _, line in stream.pending]  # type: ignore[attr-defined]


async def test_messages_go_where_their_routes_say() -> None:
    channel = NetworkChannel(split=True, keep_lines=256, keep_bytes=1 << 20)
    session = channel.stream_for("s1")
    taken: list[bytes] = []
    # A message whose text names another session still goes by its route: nothing is read.
    about_s2 = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s2"}}\n'
    lines = [about_s2, b'{"id":1}\n', b'{"id":2}\n', b'{"id":3}\n']
    await channel.send(lines, ["s1", None, AnswerCapture(taken.append), "unknown"])
    assert pending(session) == [about_s2[:-1]]
    assert pending(channel.main) == [b'{"id":1}', b'{"id":3}']
    assert taken == [b'{"id":2}']


async def test_a_websocket_channel_has_one_stream_for_every_route() -> None:
    channel = NetworkChannel(split=False, keep_lines=256, keep_bytes=1 << 20)
    attachment = channel.main.attach()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.send, [b"{}\n", b"[]\n"], ["s1", None])
        batch = await attachment.next_batch(idle_after=float("inf"))
        assert [line for _, line in batch] == [b"{}", b"[]"]
        attachment.written(batch)


async def test_delivered_messages_come_out_whole_with_their_routes() -> None:
    channel = NetworkChannel(split=True, keep_lines=256, keep_bytes=1 << 20)
    await channel.deliver(b'{"a":\n1}', "s1")
    assert await channel.receive() == ((b'{"a":\n1}',), "s1")
    channel.finish_input()
    assert await channel.receive() is None


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "héllo wörld, ça va?",
        "中文的文本，很长的一句话。",
        "an emoji 😀 beyond the plane, and U+2028 \u2028 too",
        'quotes " and backslashes \\ \\" \\\\ and a literal \\u00e9 beside é',
        "controls \t\n\x01 then ü",
    ],
)
def test_the_sse_escaping_is_a_dump_with_ensure_ascii(text: str) -> None:
    value = {"jsonrpc": "2.0", "method": "m", "params": {"text": text, "k": ["é", 1, "x"]}}
    line = orjson.dumps(value)
    escaped = _ascii(line)
    assert escaped.isascii()
    assert orjson.loads(escaped) == value
    assert escaped == json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode()
