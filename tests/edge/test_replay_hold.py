"""A replay's hold on one session's updates: every other task's updates of that session wait
for its end, other sessions' do not (through a real rpc peer over an in-memory stream)."""

from __future__ import annotations

import orjson
import trio
import trio.testing

from maple_acp.edge._client import ClientChannel
from maple_acp.rpc import JsonRpcPeer, encode_notification


def line(session_id: str, text: str) -> bytes:
    return encode_notification("session/update", {"sessionId": session_id, "update": text})


async def read_lines(stream: trio.abc.ReceiveStream, count: int) -> list[tuple[str, str]]:
    data = b""
    while data.count(b"\n") < count:
        data += await stream.receive_some()
    messages = [orjson.loads(raw) for raw in data.splitlines()]
    return [(m["params"]["sessionId"], m["params"]["update"]) for m in messages]


async def test_a_hold_keeps_other_tasks_updates_of_the_session_until_it_ends() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    peer = JsonRpcPeer(ours)
    channel = ClientChannel(peer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve)
        async with channel.hold("s"):
            nursery.start_soon(channel.send, "s", line("s", "live"))
            nursery.start_soon(channel.send_lines, "s", [line("s", "live too")])
            nursery.start_soon(channel.send_many, "other", [line("other", "elsewhere")])
            await trio.testing.wait_all_tasks_blocked()
            await channel.send_many("s", [line("s", "replayed")])
            await channel.send("s", line("s", "end of replay"))
        with trio.fail_after(5):
            got = await read_lines(theirs, 5)
        nursery.cancel_scope.cancel()
    assert got[:3] == [("other", "elsewhere"), ("s", "replayed"), ("s", "end of replay")]
    assert sorted(got[3:]) == [("s", "live"), ("s", "live too")]
