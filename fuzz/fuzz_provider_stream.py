"""Fuzz target: a provider's streamed Chat Completions answer, from the bytes on the wire to the
text, reasoning, tool calls and usage the provider backend assembles.

The bytes go through the very reading a turn uses (``maple_acp.backends.openai._stream``:
``read_answer`` over the body arriving in chunks of a fuzzed size, its ``SseEvents`` framing,
the ``orjson`` decoding of each event, ``StreamedAnswer.tool_calls``), with a stand-in turn
that keeps what it is sent. The first byte picks the input:

- even: raw bytes as the event stream. Whatever they are, the only failure is the backend's
  own ``ProviderFault`` (a malformed stream, or an error event); and the outcome does not
  depend on how the body was split into chunks (the same answer or the same fault for the
  whole body at once).
- odd: a well-formed answer as a provider streams it: text and reasoning pieces and up to
  three tool calls whose ``arguments`` strings are cut into fragments at fuzzed places and
  interleaved with other chunks, plus a usage chunk. The assembled text, reasoning, tool call
  ids, names and arguments and the usage must equal what was sent, however it was cut.

Run ``python fuzz/fuzz_provider_stream.py -atheris_runs=N``; tests import :func:`fuzz_one`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import trio

from maple_acp.backends.openai import _stream as stream
from maple_acp.backends.provider import MALFORMED_STREAM, ProviderFault

_FINISH = ("stop", "tool_calls", "length", "content_filter", None)
#: SSE event separators a provider may use.
_ENDINGS = ("\n\n", "\r\n\r\n", "\r\r")

Outcome = tuple[Any, ...]


class _Turn:
    """What ``read_answer`` sends to a turn, kept."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.thought: list[str] = []

    async def send_text(self, text: str, *, message_id: str | None = None) -> str:
        self.text.append(text)
        return "m"

    async def send_thought(self, text: str, *, message_id: str | None = None) -> str:
        self.thought.append(text)
        return "t"


async def _read(body: bytes, chunk: int) -> Outcome:
    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), chunk):
            yield body[start : start + chunk]

    turn = _Turn()
    answer = stream.StreamedAnswer()
    try:
        await stream.read_answer(turn, chunks(), answer)  # type: ignore[arg-type]
    except ProviderFault as fault:
        assert fault.line in (MALFORMED_STREAM, stream.STREAM_ERROR), fault.line  # noqa: PT017
        return ("fault", fault.line)
    assert "".join(turn.text) == "".join(answer.text)
    calls = tuple(
        (call.call_id, call.name, call.arguments) for call in answer.tool_calls(request_number=1)
    )
    return (
        "answer",
        "".join(turn.text),
        "".join(turn.thought),
        calls,
        answer.finish_reason,
        answer.usage,
    )


def assemble(body: bytes, chunk: int) -> Outcome:
    """What the backend makes of ``body`` arriving ``chunk`` bytes at a time: ``("answer",
    text, reasoning, calls, finish, usage)`` or ``("fault", line)``. Anything else raises."""
    return trio.run(_read, body, chunk)


class _Reader:
    """Draws small decisions from the fuzz input, then zeros once it runs out."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        value = self.data[self.at] if self.at < len(self.data) else 0
        self.at += 1
        return value

    def below(self, bound: int) -> int:
        return self.byte() % bound

    def text(self, longest: int) -> str:
        size = self.below(longest + 1)
        raw = self.data[self.at : self.at + size]
        self.at += size
        return raw.decode("utf-8", "replace")


def _event(payload: dict[str, Any], ending: str) -> str:
    return "data: " + json.dumps(payload, ensure_ascii=False) + ending


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fuzz",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _structured(data: bytes) -> None:
    read = _Reader(data)
    ending = _ENDINGS[read.below(len(_ENDINGS))]
    chunk = read.below(48) + 1
    texts = [read.text(24) for _ in range(read.below(4))]
    thoughts = [read.text(16) for _ in range(read.below(3))]
    calls = []
    for index in range(read.below(4)):
        call_id = f"call_{read.text(6)}" if read.below(4) else ""
        name = read.text(12) or "shell"
        arguments = read.text(80)
        cuts = sorted({read.below(len(arguments) + 1) for _ in range(read.below(6))})
        pieces = [arguments[a:b] for a, b in zip([0, *cuts], [*cuts, len(arguments)], strict=True)]
        calls.append((index, call_id, name, arguments, [p for p in pieces if p] or [""]))
    # Every fragment as its own chunk; the order mixes calls, text and reasoning as a
    # provider may.
    events: list[dict[str, Any]] = [_delta({"role": "assistant", "content": ""})]
    pending = [("text", t) for t in texts] + [("thought", t) for t in thoughts]
    for index, call_id, name, _, pieces in calls:
        for number, piece in enumerate(pieces):
            fragment: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
            if number == 0:
                fragment.update(type="function", id=call_id or None)
                fragment["function"]["name"] = name
            pending.append(("tool", fragment))
    ordered: list[tuple[str, Any]] = []
    texts_left = [item for item in pending if item[0] != "tool"]
    tools_left = [item for item in pending if item[0] == "tool"]
    while texts_left or tools_left:
        source = tools_left if tools_left and (not texts_left or read.below(2)) else texts_left
        ordered.append(source.pop(0))
    for kind, value in ordered:
        if kind == "text":
            events.append(_delta({"content": value}))
        elif kind == "thought":
            events.append(_delta({"content": None, "reasoning_content": value}))
        else:
            events.append(_delta({"tool_calls": [value]}))
    finish = _FINISH[read.below(len(_FINISH))]
    events.append(_delta({}, finish))
    prompt_tokens, completion_tokens = read.byte() * 7, read.byte()
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    events.append({**_delta({}), "choices": [], "usage": usage})
    body = ("".join(_event(event, ending) for event in events) + "data: [DONE]" + ending).encode()

    outcome = assemble(body, chunk)
    assert outcome[0] == "answer", outcome
    _, text, reasoning, assembled, finish_reason, assembled_usage = outcome
    assert text == "".join(texts)
    assert reasoning == "".join(thoughts)
    expected = tuple(
        (call_id or f"call_1_{index}", name, arguments)
        for index, call_id, name, arguments, _ in calls
    )
    assert assembled == expected, (assembled, expected)
    assert finish_reason == finish
    assert assembled_usage.input_tokens == prompt_tokens
    assert assembled_usage.output_tokens == completion_tokens
    assert assembled_usage.total_tokens == prompt_tokens + completion_tokens


def _raw(data: bytes) -> None:
    chunk = data[0] % 32 + 1 if data else 1
    body = data[1:]
    whole = assemble(body, max(len(body), 1))
    assert assemble(body, chunk) == whole, "the answer depends on how the body was split"


def fuzz_one(data: bytes) -> None:
    """Check the invariants above on one input. Raises AssertionError on a violation."""
    if not data:
        return
    if data[0] % 2:
        _structured(data[1:])
    else:
        _raw(data[1:])


def main() -> None:
    from _atheris import run

    # The backend's reading and this file guide the fuzzer.
    modules = ["maple_acp.backends.openai._stream", __name__]
    run("fuzz_provider_stream", fuzz_one, modules, max_len=1024)


if __name__ == "__main__":
    main()
