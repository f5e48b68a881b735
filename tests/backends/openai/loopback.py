"""A real OpenAI-compatible HTTP server on 127.0.0.1, scripted per test.

It speaks HTTP/1.1 over a real TCP socket (keep-alive, chunked streaming), answers
``POST .../chat/completions`` from a queue of scripted replies and ``GET .../models`` from a
fixed reply, records every request it read, and notices when a client drops a connection.
Streaming replies are ``data:`` lines with ``[DONE]``; a reply can also stall, break off, carry
a malformed line, or be an error status with a body and headers (``Retry-After``).

Run as a script (``python loopback.py PORT_FILE N_TOKENS``) it serves the provider benchmark
from a separate process: every chat request gets a stream of N one-token events (or as many as
its last message asks for, when that message is a number), and the moment each chat request's
first bytes arrived (``time.monotonic_ns``, one clock for every process) is printed as a line
``arrived NS`` on stdout.
"""

from __future__ import annotations

import json
import ssl
import time
from collections import deque
from typing import Any

import attrs
import trio

_MAX_HEAD = 64 * 1024


@attrs.define
class Reply:
    """One scripted answer. ``events`` are ``data:`` payloads (dicts become JSON; strings are
    sent as they are); a non-streaming reply has ``body``."""

    status: int = 200
    headers: dict[str, str] = attrs.field(factory=dict)
    body: Any = None
    events: list[Any] | None = None
    #: Send ``data: [DONE]`` after the events.
    done: bool = True
    #: After the events, send nothing more until the client goes away.
    stall: bool = False
    #: After the events, drop the connection without ending the chunked body.
    break_off: bool = False
    #: Send the events (and the end) in one write, as a fast server's buffered stream
    #: arrives: the client reads many events at once.
    one_write: bool = False
    #: Wait for this event before sending the events (to hold a stream open).
    hold: trio.Event | None = None
    #: Send nothing at all, not even the status line, until the client goes away.
    silent: bool = False
    #: Send these bytes as they are (status line, headers and body: what a real server was
    #: seen to send), then drop the connection when ``break_off`` is set.
    raw: bytes | None = None
    #: Stream this token again and again, one an event: up to the request's ``max_tokens``
    #: (then ``finish_reason: length``), or with none until the client goes away, as a local
    #: server does for a model that never stops.
    rambling: str | None = None


@attrs.define
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    #: ``time.monotonic_ns()`` when the request's first bytes were read.
    arrived_ns: int = 0
    #: The body as it came, byte for byte.
    raw_body: bytes = b""


def chunk(
    *,
    content: str | None = None,
    reasoning_content: str | None = None,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning_content is not None:
        delta["reasoning_content"] = reasoning_content
    if reasoning is not None:
        delta["reasoning"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(prompt: int, completion: int, *, cached: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def text_reply(
    *pieces: str, usage: tuple[int, int] | None = (10, 5), finish: str = "stop"
) -> Reply:
    events: list[Any] = [chunk(content=piece) for piece in pieces]
    events.append(chunk(finish_reason=finish))
    if usage is not None:
        events.append(usage_chunk(*usage))
    return Reply(events=events)


def tool_call_reply(
    *calls: tuple[str, str, dict[str, Any]],
    text: str | None = None,
    pieces: int = 3,
    usage: tuple[int, int] | None = (20, 10),
) -> Reply:
    """A response asking for ``calls`` (id, name, arguments), each call's arguments split into
    ``pieces`` fragments across chunks."""
    events: list[Any] = []
    if text is not None:
        events.append(chunk(content=text))
    for index, (call_id, name, arguments) in enumerate(calls):
        encoded = json.dumps(arguments)
        step = max(1, -(-len(encoded) // pieces))
        parts = [encoded[i : i + step] for i in range(0, len(encoded), step)]
        events.append(
            chunk(
                tool_calls=[
                    {
                        "index": index,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                ]
            )
        )
        events.extend(
            chunk(tool_calls=[{"index": index, "function": {"arguments": part}}]) for part in parts
        )
    events.append(chunk(finish_reason="tool_calls"))
    if usage is not None:
        events.append(usage_chunk(*usage))
    return Reply(events=events)


def error_reply(status: int, message: str = "error", **headers: str) -> Reply:
    return Reply(
        status=status,
        headers={key.replace("_", "-"): value for key, value in headers.items()},
        body={"error": {"message": message, "type": "test_error", "code": None}},
    )


class LoopbackProvider:
    """The server. ``script`` answers chat requests in order; ``models`` answers model lists."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        #: Serve HTTPS with this server context instead of plain HTTP.
        self.tls = tls
        self.script: deque[Reply] = deque()
        self.models: Reply = error_reply(404, "no model list")
        self.requests: list[Recorded] = []
        #: Connections the client opened, counted as they are accepted.
        self.connections = 0
        #: Connections the client closed, counted as they close.
        self.closed = 0
        self.closed_event = trio.Event()
        self.port = 0
        #: Set while a reply is stalled or held, so a test can cancel at that moment.
        self.streaming = trio.Event()
        #: Set when a request has been read.
        self.requested = trio.Event()

    @property
    def base_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    def add(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners: list[Any] = list(await trio.open_tcp_listeners(0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]
        if self.tls is not None:
            listeners = [trio.SSLListener(listener, self.tls) for listener in listeners]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        buffer = bytearray()
        try:
            while True:
                request = await _read_request(stream, buffer)
                if request is None:
                    return
                self.requests.append(request)
                self.requested.set()
                if request.path.endswith("/models"):
                    reply = self.models
                elif self.script:
                    reply = self.script.popleft()
                else:
                    reply = error_reply(500, "no scripted reply left")
                if reply.rambling is not None:
                    body = request.body if isinstance(request.body, dict) else {}
                    reply = _rambled(reply.rambling, body.get("max_tokens"))
                if not await self._answer(stream, reply):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self.closed += 1
            self.closed_event.set()
            self.closed_event = trio.Event()
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _answer(self, stream: trio.abc.Stream, reply: Reply) -> bool:
        """Send ``reply``; False when the connection is to be dropped."""
        if reply.raw is not None:
            await stream.send_all(reply.raw)
            return not reply.break_off
        if reply.silent:
            self.streaming.set()
            await _wait_for_close(stream)
            return False
        if reply.events is None and reply.stall:
            await stream.send_all(_head(reply.status, {"content-length": "100"}) + b"\r\n")
            self.streaming.set()
            await _wait_for_close(stream)
            return False
        if reply.events is None:
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            head = _head(reply.status, {"content-type": "application/json", **reply.headers})
            head += f"content-length: {len(body)}\r\n\r\n".encode()
            await stream.send_all(head + body)
            return True
        head = _head(
            reply.status,
            {"content-type": "text/event-stream", "transfer-encoding": "chunked", **reply.headers},
        )
        await stream.send_all(head + b"\r\n")
        if reply.hold is not None:
            self.streaming.set()
            await _wait_or_peer_gone(stream, reply.hold)
        if reply.one_write:
            body = b"".join(
                f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode()
                for e in reply.events
            )
            if reply.done:
                body += b"data: [DONE]\n\n"
            await stream.send_all(f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
            return True
        for event in reply.events:
            payload = event if isinstance(event, str) else json.dumps(event)
            await _send_chunk(stream, f"data: {payload}\n\n".encode())
        if reply.stall:
            self.streaming.set()
            await _wait_for_close(stream)
            return False
        if reply.break_off:
            return False
        if reply.done:
            await _send_chunk(stream, b"data: [DONE]\n\n")
        await stream.send_all(b"0\r\n\r\n")
        return True


def _rambled(token: str, max_tokens: object) -> Reply:
    if not isinstance(max_tokens, int):
        # Endless: a stalled stream after a first token stands for it.
        return Reply(events=[chunk(content=token)], stall=True)
    events: list[Any] = [chunk(content=token) for _ in range(max_tokens)]
    events += [chunk(finish_reason="length"), usage_chunk(10, max_tokens)]
    return Reply(events=events, one_write=True)


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status < 400 else 'Error'}"]
    lines.extend(f"{key}: {value}" for key, value in headers.items())
    return ("\r\n".join(lines) + "\r\n").encode()


async def _send_chunk(stream: trio.abc.Stream, data: bytes) -> None:
    await stream.send_all(f"{len(data):x}\r\n".encode() + data + b"\r\n")


async def _wait_for_close(stream: trio.abc.Stream) -> None:
    while await stream.receive_some(65536):
        pass


async def _wait_or_peer_gone(stream: trio.abc.Stream, event: trio.Event) -> None:
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await _wait_for_close(stream)
            nursery.cancel_scope.cancel()
            raise trio.BrokenResourceError("the client went away")

        nursery.start_soon(watch)
        await event.wait()
        nursery.cancel_scope.cancel()


async def _read_request(stream: trio.abc.Stream, buffer: bytearray) -> Recorded | None:
    arrived_ns = time.monotonic_ns() if buffer else 0
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        if not buffer:
            arrived_ns = time.monotonic_ns()
        buffer += data
        if len(buffer) > _MAX_HEAD:
            raise trio.BrokenResourceError("request head too large")
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        name = key.strip().lower()
        # A repeated header is kept as HTTP folds it, so a test sees that it was repeated.
        headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        data = await stream.receive_some(65536)
        if not data:
            return None
        body += data
    buffer[:] = body[length:]
    parsed: Any = json.loads(bytes(body[:length])) if length else None
    return Recorded(
        method=method,
        path=path,
        headers=headers,
        body=parsed,
        arrived_ns=arrived_ns,
        raw_body=bytes(body[:length]),
    )


async def _bench_main(port_file: str, tokens: int) -> None:
    """Serve the benchmark's streams (see the module docstring)."""
    server = LoopbackProvider()

    class Endless(deque[Reply]):
        def popleft(self) -> Reply:
            request = server.requests[-1]
            print(f"arrived {request.arrived_ns}", flush=True)
            count = tokens
            messages = request.body.get("messages") if isinstance(request.body, dict) else None
            last = messages[-1].get("content") if messages else None
            if isinstance(last, str) and last.strip().isdigit():
                count = int(last)
            return text_reply(*(["tok "] * count), usage=(10, count))

        def __bool__(self) -> bool:
            return True

    server.script = Endless()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        with open(port_file, "w") as handle:
            handle.write(str(server.port))
        await trio.sleep_forever()


if __name__ == "__main__":
    import sys

    trio.run(_bench_main, sys.argv[1], int(sys.argv[2]))
