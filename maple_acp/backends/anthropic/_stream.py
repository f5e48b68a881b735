"""One streamed Messages answer, assembled: the events the SDK's own SSE decoder splits from
the response bytes (its raw events: each event's JSON decoded with ``orjson``, no typed model
per event, which at one token per event costs more than the rest of a token's path) read into
content blocks (text, thinking with its signature, redacted thinking, tool calls with their JSON
input), the stop reason and the usage; text and thinking of one network read go to the turn as
one piece each. Each thinking block is its own thought message, signed in the history
(``Turn.sign_thought``) when the block ends, so a later turn can send it back intact.

Error handling: an event that is not JSON or has the wrong shape is
``ProviderFault(MALFORMED_STREAM)``; an ``error`` event is its own fault (an overload is a
retryable rate limit), never the provider's text.

Cancellation: the reads checkpoint; the caller closes the response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, cast

import attrs
import orjson

from maple_acp.backends.anthropic._messages import Block
from maple_acp.backends.provider import (
    MALFORMED_STREAM,
    MAX_ARGUMENT_CHARS,
    ModelPrices,
    ProviderFault,
    ToolCall,
    error_code,
    stream_error,
)
from maple_acp.runtime import Turn, Usage

_loads = orjson.loads

#: Content blocks kept from one response; more is a broken stream, not a plan.
MAX_BLOCKS_PER_RESPONSE = 256
#: Tokens per price unit: prices are USD per million tokens.
TOKENS_PER_PRICE_UNIT = 1_000_000


@attrs.define
class Draft:
    """One content block as it streams in: the block to send back, and a tool call's input."""

    block: Block
    json_parts: list[str] = attrs.field(factory=list)
    json_size: int = 0
    #: A thinking block's thought message (its own, so that its signature is stored with
    #: exactly the text it signs).
    message_id: str | None = None


@attrs.define
class StreamedAnswer:
    """One streamed answer as it was assembled."""

    blocks: dict[int, Draft] = attrs.field(factory=dict)
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    #: The provider reported usage (without it the counts above are not counts).
    usage_reported: bool = False
    #: Something of this answer already reached the caller: it can no longer be retried.
    forwarded: bool = False
    #: The provider has sent some of the body: it is answering, not keeping the turn waiting.
    started: bool = False
    #: ``message_stop`` arrived: the answer is whole.
    complete: bool = False

    def content(self) -> list[Block]:
        """The assistant's blocks in order, as the next request sends them back."""
        blocks = []
        for index in sorted(self.blocks):
            draft = self.blocks[index]
            block = draft.block
            if block["type"] == "tool_use":
                block = {**block, "input": tool_input(draft)}
            elif (
                block["type"] == "ignored"
                or (block["type"] == "text" and not block["text"])
                or (block["type"] == "thinking" and not block["signature"])
            ):
                # Thinking goes back only with its signature (the provider refuses it without).
                continue
            blocks.append(block)
        return blocks

    def text(self) -> str:
        return "".join(
            draft.block["text"] for draft in self.blocks.values() if draft.block["type"] == "text"
        )

    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for index in sorted(self.blocks):
            draft = self.blocks[index]
            if draft.block["type"] != "tool_use":
                continue
            arguments = (
                ("".join(draft.json_parts) or "{}")
                if draft.json_size <= MAX_ARGUMENT_CHARS
                else None
            )
            calls.append(
                ToolCall(call_id=draft.block["id"], name=draft.block["name"], arguments=arguments)
            )
        return calls

    def usage(self) -> Usage:
        prompt = self.input_tokens + self.cache_read + self.cache_write
        return Usage(
            input_tokens=prompt,
            output_tokens=self.output_tokens,
            total_tokens=prompt + self.output_tokens,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
        )

    def cost(self, prices: ModelPrices) -> float:
        return (
            self.input_tokens * prices.input
            + self.output_tokens * prices.output
            + self.cache_read * prices.cache_read
            + self.cache_write * prices.cache_write
        ) / TOKENS_PER_PRICE_UNIT


def tool_input(draft: Draft) -> Any:
    if draft.json_size > MAX_ARGUMENT_CHARS:
        return {}
    try:
        value = json.loads("".join(draft.json_parts) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Forwarder:
    """Text and thinking waiting to go to the turn: everything of one network read goes as one
    piece of each (a change of kind sends what came before it), so a fast stream costs one
    update per read, not one per token; nothing is held back for later bytes."""

    __slots__ = ("_answer", "_compaction", "_kind", "_pieces", "_text_id", "_thought_id", "_turn")

    def __init__(self, turn: Turn, answer: StreamedAnswer, compaction_id: str | None) -> None:
        self._turn = turn
        self._answer = answer
        #: A summary is being read: its text is that compaction's, its thinking nobody's.
        self._compaction = compaction_id
        self._pieces: list[str] = []
        self._kind = ""
        self._text_id: str | None = None
        self._thought_id: str | None = None

    async def new_thought(self) -> str:
        """Start a new thought message (one per thinking block); returns its id."""
        await self.flush()
        self._thought_id = self._turn.new_message_id()
        return self._thought_id

    async def sign(self, draft: Draft) -> None:
        """A thinking block has ended: its thought goes to the history with its signature."""
        await self.flush()
        block = draft.block
        if self._compaction is not None:
            return
        if draft.message_id is not None and block["thinking"] and block["signature"]:
            self._turn.sign_thought(draft.message_id, block["signature"])

    async def add(self, kind: str, piece: str) -> None:
        if kind != self._kind:
            await self.flush()
            self._kind = kind
        self._pieces.append(piece)

    async def flush(self) -> None:
        if not self._pieces:
            return
        text = "".join(self._pieces)
        self._pieces.clear()
        if self._compaction is not None:
            if self._kind == "text":
                await self._turn.send_compaction_text(self._compaction, text)
            return
        self._answer.forwarded = True
        if self._kind == "text":
            self._text_id = await self._turn.send_text(text, message_id=self._text_id)
        else:
            self._thought_id = await self._turn.send_thought(text, message_id=self._thought_id)


@attrs.frozen
class _Body:
    """What the SDK's event decoder reads from: the response's bytes, through ``reads``."""

    reads: AsyncIterator[bytes]

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return self.reads


async def read_stream(
    turn: Turn,
    chunks: AsyncIterator[bytes],
    response: StreamedAnswer,
    compaction_id: str | None = None,
) -> None:
    """Read one response body into ``response`` through the SDK's own SSE decoder (its raw
    events: no typed model per event), forwarding text and thinking as they come (with
    ``compaction_id``, the text as that compaction's summary). Transport errors propagate as
    they are (the caller maps them)."""
    import anthropic

    forward = _Forwarder(turn, response, compaction_id)

    async def reads() -> AsyncIterator[bytes]:
        async for chunk in chunks:
            response.started = True
            yield chunk
            # The decoder asks for more bytes only after it gave out every event of these.
            await forward.flush()

    events: Any = anthropic.AsyncStream.raw_events(cast(Any, _Body(reads())))
    async with aclosing(events):
        async for sse in events:
            name = sse.event
            if name == "ping" or not sse.data:
                continue
            if name == "error":
                raise _stream_error(sse.data)
            try:
                event = _loads(sse.data)
            except orjson.JSONDecodeError:
                raise ProviderFault(MALFORMED_STREAM) from None
            try:
                await _apply(event, response, forward)
            except (AttributeError, TypeError, KeyError):
                raise ProviderFault(MALFORMED_STREAM) from None
    await forward.flush()


def _stream_error(data: str) -> ProviderFault:
    """The fault of an ``error`` event (never the provider's text)."""
    try:
        body = _loads(data)
    except orjson.JSONDecodeError:
        body = None
    return stream_error(error_code(body))


async def _apply(event: Any, response: StreamedAnswer, forward: _Forwarder) -> None:
    kind = event["type"]
    if kind == "content_block_delta":
        draft = response.blocks.get(event["index"])
        if draft is None:
            raise ProviderFault(MALFORMED_STREAM)
        delta = event["delta"]
        delta_kind = delta["type"]
        if delta_kind == "text_delta":
            piece = _str(delta["text"])
            draft.block["text"] += piece
            await forward.add("text", piece)
        elif delta_kind == "thinking_delta":
            piece = _str(delta["thinking"])
            draft.block["thinking"] += piece
            await forward.add("thinking", piece)
        elif delta_kind == "signature_delta":
            draft.block["signature"] += _str(delta["signature"])
        elif delta_kind == "input_json_delta":
            piece = _str(delta["partial_json"])
            draft.json_size += len(piece)
            if draft.json_size <= MAX_ARGUMENT_CHARS:
                draft.json_parts.append(piece)
    elif kind == "content_block_start":
        draft = _start_block(response, event["index"], event["content_block"])
        if draft.block["type"] == "thinking":
            draft.message_id = await forward.new_thought()
    elif kind == "content_block_stop":
        draft = response.blocks.get(event["index"])
        if draft is not None and draft.block["type"] == "thinking":
            await forward.sign(draft)
    elif kind == "message_start":
        _take_usage(response, event["message"].get("usage"))
    elif kind == "message_delta":
        response.stop_reason = _str(event["delta"].get("stop_reason") or "")
        _take_usage(response, event.get("usage"))
    elif kind == "message_stop":
        response.complete = True


def _start_block(response: StreamedAnswer, index: object, block: Any) -> Draft:
    if not isinstance(index, int) or index in response.blocks:
        raise ProviderFault(MALFORMED_STREAM)
    if len(response.blocks) >= MAX_BLOCKS_PER_RESPONSE:
        raise ProviderFault(MALFORMED_STREAM)
    kind = block["type"]
    if kind == "text":
        # Text arrives in deltas; a start carrying text is folded into the first one.
        response.blocks[index] = Draft({"type": "text", "text": ""})
    elif kind == "thinking":
        response.blocks[index] = Draft(
            {"type": "thinking", "thinking": "", "signature": _str(block.get("signature") or "")}
        )
    elif kind == "redacted_thinking":
        # Encrypted thinking: never shown, but sent back as it came.
        response.blocks[index] = Draft({"type": "redacted_thinking", "data": _str(block["data"])})
    elif kind == "tool_use":
        response.blocks[index] = Draft(
            {"type": "tool_use", "id": _str(block["id"]), "name": _str(block["name"]), "input": {}}
        )
    else:
        # A block kind this backend does not know is neither shown nor sent back.
        response.blocks[index] = Draft({"type": "ignored"})
    return response.blocks[index]


def _take_usage(response: StreamedAnswer, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    response.usage_reported = True
    for name, field in (
        ("input_tokens", "input_tokens"),
        ("output_tokens", "output_tokens"),
        ("cache_read_input_tokens", "cache_read"),
        ("cache_creation_input_tokens", "cache_write"),
    ):
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            setattr(response, field, value)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ProviderFault(MALFORMED_STREAM)
    return value
