"""A real HTTP server on 127.0.0.1 speaking Anthropic's Messages streaming format: the
OpenAI-compatible loopback server (``tests/backends/openai/loopback.py``: real TCP, keep-alive,
chunked streaming, recorded requests, scripted faults) with each streamed event sent as an
``event:`` line and its ``data:`` line, so that the SDK's own decoder reads it.

Run as a script (``python messages_loopback.py PORT_FILE N_TOKENS``) it serves one endless
stream script for the provider benchmark from a separate process."""

from __future__ import annotations

import json
import sys
from collections import deque
from pathlib import Path
from typing import Any

import trio

# Run as a script (the benchmark), the OpenAI-compatible server's module is found here.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "openai"))

from loopback import (
    LoopbackProvider,
    Recorded,
    Reply,
    _head,
    _send_chunk,
    _wait_for_close,
    _wait_or_peer_gone,
    error_reply,
)

__all__ = ["MessagesProvider", "Reply", "error_reply"]


class MessagesProvider(LoopbackProvider):
    """The server: ``POST /v1/messages`` answered from ``script``, ``GET /v1/models`` from
    ``models``. A streamed reply's events are dicts (sent as ``event: <type>`` + JSON data) or
    strings (sent as they are, for malformed streams)."""

    def message_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/messages")]

    async def _answer(self, stream: trio.abc.Stream, reply: Reply) -> bool:
        if reply.events is None or reply.silent:
            return await super()._answer(stream, reply)
        head = _head(
            reply.status,
            {"content-type": "text/event-stream", "transfer-encoding": "chunked", **reply.headers},
        )
        await stream.send_all(head + b"\r\n")
        if reply.hold is not None:
            self.streaming.set()
            await _wait_or_peer_gone(stream, reply.hold)
        for event in reply.events:
            if isinstance(event, str):
                data = event
            else:
                data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
            await _send_chunk(stream, data.encode())
        if reply.stall:
            self.streaming.set()
            await _wait_for_close(stream)
            return False
        if reply.break_off:
            return False
        await stream.send_all(b"0\r\n\r\n")
        return True


def message_start(input_tokens: int = 10, *, cache_read: int = 0, cache_write: int = 0) -> Any:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": "test-model",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": 1,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": cache_write,
            },
        },
    }


def text_block(index: int, *pieces: str) -> list[Any]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": piece},
            }
            for piece in pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def thinking_block(index: int, thinking: str, signature: str) -> list[Any]:
    start = {"type": "thinking", "thinking": "", "signature": ""}
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": thinking},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": signature},
        },
        {"type": "content_block_stop", "index": index},
    ]


def tool_use_block(index: int, use_id: str, name: str, arguments: dict[str, Any]) -> list[Any]:
    encoded = json.dumps(arguments)
    half = len(encoded) // 2
    start = {"type": "tool_use", "id": use_id, "name": name, "input": {}}
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part},
            }
            for part in (encoded[:half], encoded[half:])
        ),
        {"type": "content_block_stop", "index": index},
    ]


def message_end(stop_reason: str = "end_turn", output_tokens: int = 5) -> list[Any]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def text_reply(*pieces: str, stop: str = "end_turn", **usage: int) -> Reply:
    return Reply(events=[message_start(**usage), *text_block(0, *pieces), *message_end(stop)])


def tool_reply(
    *calls: tuple[str, str, dict[str, Any]],
    text: str | None = None,
    thinking: tuple[str, str] | None = None,
) -> Reply:
    """An answer asking for ``calls`` (id, name, input), after optional thinking (text and
    signature) and text."""
    events: list[Any] = [message_start(20)]
    index = 0
    if thinking is not None:
        events.extend(thinking_block(index, *thinking))
        index += 1
    if text is not None:
        events.extend(text_block(index, text))
        index += 1
    for use_id, name, arguments in calls:
        events.extend(tool_use_block(index, use_id, name, arguments))
        index += 1
    events.extend(message_end("tool_use", 10))
    return Reply(events=events)


def overloaded_reply(**headers: str) -> Reply:
    return Reply(
        status=529,
        headers={key.replace("_", "-"): value for key, value in headers.items()},
        body={"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )


async def _bench_main(port_file: str, tokens: int) -> None:
    """Serve the same long text stream to every request, for the benchmark."""
    server = MessagesProvider()

    class Endless(deque[Reply]):
        def popleft(self) -> Reply:
            request = server.requests[-1]
            print(f"arrived {request.arrived_ns}", flush=True)
            count = tokens
            messages = request.body.get("messages") if isinstance(request.body, dict) else None
            last = messages[-1].get("content") if messages else None
            if isinstance(last, list) and last and isinstance(last[-1], dict):
                last = last[-1].get("text")
            if isinstance(last, str) and last.strip().isdigit():
                count = int(last)
            return text_reply(*(["tok "] * count))

        def __bool__(self) -> bool:
            return True

    server.script = Endless()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        with open(port_file, "w") as handle:
            handle.write(str(server.port))
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(_bench_main, sys.argv[1], int(sys.argv[2]))
