"""Encode + frame of a 100-byte ``agent_message_chunk`` notification, against plain orjson.

Prints lines/s for both in the same run and their ratio (absolute figures move between runs
on these machines; the ratio is what counts), then the throughput of ``JsonRpcPeer.notify``
over a real Unix socketpair to a reader that discards everything.

Usage: ``python bench/bench_encode.py [--lines N]``.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import trio

from maple_acp.rpc import JsonRpcPeer, encode_notification

METHOD = "session/update"
TEXT = "x" * 100
ROUNDS = 5


def params() -> dict[str, Any]:
    return {
        "sessionId": "sess_0123456789abcdef",
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "messageId": "msg_0123456789abcdef",
            "content": {"type": "text", "text": TEXT},
        },
    }


def best_rate(count: int, body: Callable[[int], None]) -> float:
    """Lines per second of the fastest of several rounds."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        body(count)
        best = min(best, time.perf_counter() - start)
    return count / best


def plain_orjson(count: int) -> None:
    p = params()
    dumps = orjson.dumps
    for _ in range(count):
        dumps({"jsonrpc": "2.0", "method": METHOD, "params": p})


def rpc_encode_and_frame(count: int) -> None:
    # The real path: envelope, orjson with the terminating newline, and the newline guard.
    p = params()
    for _ in range(count):
        encode_notification(METHOD, p)


# The reader runs in its own process so that it never competes for this interpreter's GIL.
_DISCARD = (
    "import os\n"
    "total = 0\n"
    "while chunk := os.read(0, 65536):\n"
    "    total += len(chunk)\n"
    "os.write(1, str(total).encode())\n"
)


def over_socketpair(count: int, produce: Callable[[trio.SocketStream], Any]) -> float:
    """Lines/s of ``produce`` writing ``count`` lines to a discarding reader process."""
    ours, theirs = socket.socketpair()
    reader = subprocess.Popen(
        [sys.executable, "-c", _DISCARD], stdin=theirs.fileno(), stdout=subprocess.PIPE
    )
    theirs.close()

    async def timed() -> float:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        start = time.perf_counter()
        await produce(stream)
        elapsed = time.perf_counter() - start
        await stream.aclose()
        return elapsed

    elapsed = trio.run(timed)
    out, _ = reader.communicate()
    expected = count * len(encode_notification(METHOD, params()))
    if int(out) != expected:
        raise SystemExit(f"reader got {int(out)} bytes, expected {expected}")
    return count / elapsed


def inline_writer(count: int) -> Callable[[trio.SocketStream], Any]:
    """The floor: dumps each line, joins ~64 KiB, one send_all per batch, one task."""

    async def produce(stream: trio.SocketStream) -> None:
        p = params()
        dumps = orjson.dumps
        batch: list[bytes] = []
        size = 0
        for _ in range(count):
            line = dumps(
                {"jsonrpc": "2.0", "method": METHOD, "params": p}, option=orjson.OPT_APPEND_NEWLINE
            )
            batch.append(line)
            size += len(line)
            if size >= 65536:
                await stream.send_all(b"".join(batch))
                batch, size = [], 0
        if batch:
            await stream.send_all(b"".join(batch))

    return produce


#: Lines per ``notify_lines`` call in the batched row (a replay hands over 128 at a time).
BATCH_LINES = 128


def peer_writer(
    count: int, *, pre_encoded: bool, batched: bool = False
) -> Callable[[trio.SocketStream], Any]:
    async def produce(stream: trio.SocketStream) -> None:
        p = params()
        line = encode_notification(METHOD, p)
        peer = JsonRpcPeer(stream)
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.serve)
            if batched:
                batch = [line] * BATCH_LINES
                for _ in range(count // BATCH_LINES):
                    await peer.notify_lines(batch)
                for _ in range(count % BATCH_LINES):
                    await peer.notify_encoded(line)
            elif pre_encoded:
                for _ in range(count):
                    await peer.notify_encoded(line)
            else:
                for _ in range(count):
                    await peer.notify(METHOD, p)
            await peer.drain()
            nursery.cancel_scope.cancel()

    return produce


def row(label: str, value: str) -> None:
    print(f"  {label:<34}{value:>18}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    args = parser.parse_args()
    count: int = args.lines

    line = encode_notification(METHOD, params())
    baseline = best_rate(count, plain_orjson)
    ours = best_rate(count, rpc_encode_and_frame)
    print(f"frame: {len(line)} bytes, text {len(TEXT)} bytes, {count} lines x {ROUNDS} rounds")
    row("orjson.dumps of the dict", f"{baseline:,.0f} lines/s")
    row("rpc encode_notification (framed)", f"{ours:,.0f} lines/s")
    row("ratio rpc / orjson.dumps", f"{ours / baseline:.2f}")
    peer_count = count // 2
    floor = over_socketpair(peer_count, inline_writer(peer_count))
    notify = over_socketpair(peer_count, peer_writer(peer_count, pre_encoded=False))
    encoded = over_socketpair(peer_count, peer_writer(peer_count, pre_encoded=True))
    batched = over_socketpair(peer_count, peer_writer(peer_count, pre_encoded=True, batched=True))
    print(f"socketpair to a discarding reader process, {peer_count} lines each:")
    row("inline dumps + 64 KiB send_all", f"{floor:,.0f} lines/s")
    row("peer.notify", f"{notify:,.0f} lines/s")
    row("peer.notify_encoded", f"{encoded:,.0f} lines/s")
    row(f"peer.notify_lines ({BATCH_LINES} a call)", f"{batched:,.0f} lines/s")
    row("ratio peer.notify / inline", f"{notify / floor:.2f}")


if __name__ == "__main__":
    main()
