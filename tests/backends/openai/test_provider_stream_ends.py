"""A stream that ends without ``[DONE]`` or a finish reason is a broken answer, not an empty
one: retried while nothing of it was forwarded, else the turn fails with one line. The bytes are
what llama.cpp's Python server (uvicorn and sse-starlette) sends when generation fails after
its headers went out: a context overflow, or automatic tool choice while streaming."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from loopback import LoopbackProvider, Reply, chunk, text_reply
from provider_support import one_turn, provider_service

from maple_acp.runtime import RunNotice, RunState, TextChunk

#: The head uvicorn writes for an ``EventSourceResponse`` (captured from a real server).
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"date: Fri, 04 Dec 2026 15:52:18 GMT\r\n"
    b"server: uvicorn\r\n"
    b"cache-control: no-store\r\n"
    b"connection: keep-alive\r\n"
    b"x-accel-buffering: no\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"\r\n"
)
#: The generator failed before its first event; uvicorn closes the connection.
EMPTY_THEN_CLOSED = Reply(raw=SSE_HEAD, break_off=True)
#: The same failure behind a server that ends the chunked body properly.
EMPTY_AND_ENDED = Reply(raw=SSE_HEAD + b"0\r\n\r\n")


def sse_event(payload: dict[str, object]) -> bytes:
    """One event as sse-starlette frames it (CRLF line ends), as one HTTP chunk."""
    data = b"data: " + json.dumps(payload).encode() + b"\r\n\r\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_an_empty_answer_is_retried_and_the_retry_answers(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(EMPTY_AND_ENDED, EMPTY_THEN_CLOSED, text_reply("hello"))
    async with provider_service(tmp_path, provider, backoff=(0.0,)) as service:
        with trio.fail_after(20):
            events, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.COMPLETED
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "hello"
    assert len(provider.chat_requests()) == 3


async def test_a_server_that_always_answers_nothing_fails_the_turn_with_one_line(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(*[EMPTY_AND_ENDED] * 4)
    async with provider_service(tmp_path, provider, backoff=(0.0,)) as service:
        with trio.fail_after(20):
            events, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.FAILED
    assert outcome.failure == (
        "the provider's stream broke off before the answer ended; gave up after 3 retries"
    )
    assert not [e for e in events if isinstance(e, TextChunk)]
    assert [e.text for e in events if isinstance(e, RunNotice) and e.terminal] == [outcome.failure]
    assert len(provider.chat_requests()) == 4


async def test_a_stream_cut_after_text_fails_without_repeating_it(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    # Text, then the body ends cleanly: no finish reason, no [DONE].
    cut = SSE_HEAD + sse_event(chunk(content="Hel")) + b"0\r\n\r\n"
    provider.add(Reply(raw=cut), text_reply("Hello"))
    async with provider_service(tmp_path, provider, backoff=(0.0,)) as service:
        with trio.fail_after(20):
            events, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.FAILED
    assert outcome.failure == "the provider's stream broke off before the answer ended"
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "Hel"
    assert len(provider.chat_requests()) == 1


async def test_a_finish_reason_without_done_is_a_whole_answer(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    # Some servers end the body after the finish reason and send no [DONE].
    whole = (
        SSE_HEAD
        + sse_event(chunk(content="Hello"))
        + sse_event(chunk(finish_reason="stop"))
        + b"0\r\n\r\n"
    )
    provider.add(Reply(raw=whole))
    async with provider_service(tmp_path, provider, backoff=(0.0,)) as service:
        with trio.fail_after(20):
            events, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.COMPLETED
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "Hello"
    assert len(provider.chat_requests()) == 1
