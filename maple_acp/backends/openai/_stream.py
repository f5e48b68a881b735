"""One streamed Chat Completions answer, read as bytes: the SSE events split by hand and each
event's JSON decoded with ``orjson`` into the few fields a turn uses (text, reasoning,
tool-call fragments, finish reason, usage). No per-event model object is built: at one token
per event, the SDK's typed chunks cost more than everything else a token goes through.

:class:`SseEvents` is sans-I/O (bytes in, event payloads out); :func:`read_answer` applies the
payloads of one HTTP response to a :class:`StreamedAnswer` and forwards text and reasoning to
the turn. The request itself goes through the SDK's raw-response path (``_backend``), so
authentication, base URLs and status errors stay the SDK's.

Text and reasoning that arrived in the same network read are forwarded as one piece each (in
order: a change of kind sends what came before it): nothing is held back for later bytes.

Error handling: a payload that is not the JSON object a chunk is, or a field of the wrong type,
is ``ProviderFault(MALFORMED_STREAM)``; an ``error`` object inside the stream is its own line
(never the provider's text); a transport error or timeout while reading propagates for the
caller to map (a connection fault, retryable only while nothing was forwarded).

Cancellation: :func:`read_answer` checkpoints in each read; the caller closes the response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import orjson
import trio

from maple_acp.backends.provider import (
    MALFORMED_STREAM,
    MAX_ARGUMENT_CHARS,
    STREAM_ERROR,
    ProviderFault,
    ToolCall,
)
from maple_acp.runtime import Turn, Usage

#: One SSE event (or line) of an answer, at most: the largest a tool call's arguments may be,
#: with room for the JSON around them. A longer one is a broken stream, not an answer.
MAX_EVENT_BYTES = MAX_ARGUMENT_CHARS + 64 * 1024
#: Tool calls kept from one response; more is a broken model, not a plan.
MAX_TOOL_CALLS_PER_RESPONSE = 64
#: Bytes read after ``[DONE]`` so that the connection goes back to the pool; a server still
#: sending past this has its connection closed instead.
MAX_DRAIN_BYTES = 64 * 1024
#: ... and for at most this long (a server may hold the connection open after ``[DONE]``).
DRAIN_S = 0.1

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class SseEvents:
    """Server-sent events from bytes: ``feed`` returns the data of every event completed by
    the bytes given (the ``data:`` lines of an event joined by newlines). Lines may end with
    LF, CRLF or CR; comments and the ``event``/``id``/``retry`` fields are ignored (a chat
    stream's meaning is all in its data). An event left incomplete when the bytes end is
    dropped, as the SSE rules say."""

    __slots__ = ("_data", "_pending")

    def __init__(self) -> None:
        self._pending = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._pending:
            chunk = self._pending + chunk
        if b"\r" in chunk:
            # A CR at the end may be the first half of a CRLF: keep it for the next bytes.
            held = chunk.endswith(b"\r")
            if held:
                chunk = chunk[:-1]
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                chunk += b"\r"
        lines = chunk.split(b"\n")
        pending = self._pending = lines.pop()
        if len(pending) > MAX_EVENT_BYTES:
            raise ProviderFault(MALFORMED_STREAM)
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
            elif line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
                if len(data) > 1 and sum(map(len, data)) > MAX_EVENT_BYTES:
                    raise ProviderFault(MALFORMED_STREAM)
        return events


@attrs.define
class ToolDraft:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)
    size: int = 0


@attrs.define
class StreamedAnswer:
    """One streamed answer as it was assembled."""

    text: list[str] = attrs.field(factory=list)
    tools: dict[int, ToolDraft] = attrs.field(factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    context_used: int | None = None
    #: Something of this answer already reached the caller: it can no longer be retried.
    forwarded: bool = False
    #: The provider has streamed at least one chunk of it.
    started: bool = False
    #: ``[DONE]`` was read.
    done: bool = False

    def tool_calls(self, request_number: int) -> list[ToolCall]:
        """The calls asked for; a call without an id (some local servers send none) gets one
        that is unique within the turn, so every result pairs with its call."""
        calls = []
        for index in sorted(self.tools):
            draft = self.tools[index]
            # Arguments past the bound were not kept; the call fails as "too long".
            arguments = "".join(draft.arguments) if draft.size <= MAX_ARGUMENT_CHARS else None
            calls.append(
                ToolCall(
                    call_id=draft.call_id or f"call_{request_number}_{index}",
                    name=draft.name,
                    arguments=arguments,
                )
            )
        return calls


async def read_answer(
    turn: Turn,
    chunks: AsyncIterator[bytes],
    answer: StreamedAnswer,
    compaction_id: str | None = None,
) -> None:
    """Read the response body ``chunks`` into ``answer``, forwarding text and reasoning to
    ``turn`` as they come (one piece of each per network read); with ``compaction_id`` the
    text is that compaction's summary, not the agent's answer (and not "forwarded": a retry
    repeats nothing the user saw as the answer). Transport errors propagate as they are (the
    caller maps them)."""
    events = SseEvents()
    text_id: str | None = None
    thought_id: str | None = None
    drained = 0
    # After [DONE] the rest of the body is read (briefly, boundedly) only so that the
    # connection goes back to the pool.
    with trio.CancelScope() as drain:
        async for chunk in chunks:
            answer.started = True
            if answer.done:
                drained += len(chunk)
                if drained > MAX_DRAIN_BYTES:
                    return
                continue
            # Consecutive text (or reasoning) of this read, forwarded as one piece.
            texts: list[str] = []
            thoughts: list[str] = []
            for payload in events.feed(chunk):
                content, reasoning = _apply(payload, answer)
                if content:
                    if thoughts:
                        thought_id = await _send_thought(turn, thoughts, answer, thought_id)
                        thoughts = []
                    texts.append(content)
                if reasoning:
                    if texts:
                        text_id = await _send_text(turn, texts, answer, text_id, compaction_id)
                        texts = []
                    thoughts.append(reasoning)
                if answer.done:
                    drain.deadline = trio.current_time() + DRAIN_S
                    break
            if texts:
                text_id = await _send_text(turn, texts, answer, text_id, compaction_id)
            if thoughts:
                thought_id = await _send_thought(turn, thoughts, answer, thought_id)


async def _send_text(
    turn: Turn,
    texts: list[str],
    answer: StreamedAnswer,
    text_id: str | None,
    compaction_id: str | None,
) -> str | None:
    text = texts[0] if len(texts) == 1 else "".join(texts)
    answer.text.append(text)
    if compaction_id is not None:
        await turn.send_compaction_text(compaction_id, text)
        return text_id
    answer.forwarded = True
    return await turn.send_text(text, message_id=text_id)


async def _send_thought(
    turn: Turn, thoughts: list[str], answer: StreamedAnswer, thought_id: str | None
) -> str:
    answer.forwarded = True
    text = thoughts[0] if len(thoughts) == 1 else "".join(thoughts)
    return await turn.send_thought(text, message_id=thought_id)


def _apply(payload: bytes, answer: StreamedAnswer) -> tuple[str | None, str | None]:
    """Apply one event to ``answer``; its text and reasoning delta."""
    if payload.startswith(b"[DONE]"):
        answer.done = True
        return None, None
    try:
        chunk = _loads(payload)
    except _JSONDecodeError:
        raise ProviderFault(MALFORMED_STREAM) from None
    if type(chunk) is not dict:
        raise ProviderFault(MALFORMED_STREAM)
    if chunk.get("error"):
        # The provider's own text may quote the request or the key: not shown.
        raise ProviderFault(STREAM_ERROR)
    usage = chunk.get("usage")
    if type(usage) is dict:
        answer.usage, answer.context_used = _usage(usage)
    choices = chunk.get("choices")
    if not choices:
        return None, None
    try:
        choice = choices[0]
        delta = choice.get("delta")
        finish = choice.get("finish_reason")
    except (AttributeError, TypeError, IndexError, KeyError):
        raise ProviderFault(MALFORMED_STREAM) from None
    if finish is not None:
        if type(finish) is not str:
            raise ProviderFault(MALFORMED_STREAM)
        answer.finish_reason = finish
    if not delta:
        return None, None
    if type(delta) is not dict:
        raise ProviderFault(MALFORMED_STREAM)
    content = delta.get("content")
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if (content is not None and type(content) is not str) or (
        reasoning is not None and type(reasoning) is not str
    ):
        raise ProviderFault(MALFORMED_STREAM)
    fragments = delta.get("tool_calls")
    if fragments:
        _add_fragments(answer, fragments)
    return content, reasoning


def _add_fragments(answer: StreamedAnswer, fragments: Any) -> None:
    if type(fragments) is not list:
        raise ProviderFault(MALFORMED_STREAM)
    for fragment in fragments:
        if type(fragment) is not dict:
            raise ProviderFault(MALFORMED_STREAM)
        index = fragment.get("index")
        if type(index) is not int:
            index = len(answer.tools)
        draft = answer.tools.get(index)
        if draft is None:
            if len(answer.tools) >= MAX_TOOL_CALLS_PER_RESPONSE:
                raise ProviderFault(MALFORMED_STREAM)
            draft = answer.tools[index] = ToolDraft()
        call_id = fragment.get("id")
        if call_id and not draft.call_id:
            draft.call_id = str(call_id)
        function = fragment.get("function")
        if function is None:
            continue
        if type(function) is not dict:
            raise ProviderFault(MALFORMED_STREAM)
        name = function.get("name")
        if name and not draft.name:
            draft.name = str(name)
        arguments = function.get("arguments")
        if arguments:
            if type(arguments) is not str:
                raise ProviderFault(MALFORMED_STREAM)
            draft.size += len(arguments)
            if draft.size <= MAX_ARGUMENT_CHARS:
                draft.arguments.append(arguments)


def _usage(usage: dict[str, Any]) -> tuple[Usage, int]:
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    total = _int(usage.get("total_tokens")) or prompt + completion
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if type(details) is dict else 0
    return (
        Usage(
            input_tokens=prompt,
            output_tokens=completion,
            total_tokens=total,
            cache_read_tokens=cached,
        ),
        prompt + completion,
    )


def _int(value: object) -> int:
    return value if type(value) is int and value > 0 else 0
