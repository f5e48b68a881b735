"""One streamed Messages answer, assembled: the SDK's events read into content blocks (text,
thinking with its signature, redacted thinking, tool calls with their JSON input), the stop
reason and the usage, with text and thinking forwarded to the turn as they arrive.

Error handling: an event of the wrong shape is ``ProviderFault(MALFORMED_STREAM)``; the SDK
builds events without validating them, so a misshapen one surfaces here as a missing attribute.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from maple_acp.backends.anthropic._messages import Block
from maple_acp.backends.openai._config import ModelPrices
from maple_acp.backends.openai._faults import MALFORMED_STREAM, ProviderFault
from maple_acp.backends.openai._native import MAX_ARGUMENT_CHARS, ToolCall
from maple_acp.runtime import Turn, Usage

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


@attrs.define
class StreamedAnswer:
    """One streamed answer as it was assembled."""

    blocks: dict[int, Draft] = attrs.field(factory=dict)
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    #: Something of this answer already reached the caller: it can no longer be retried.
    forwarded: bool = False
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
            elif block["type"] == "ignored" or (block["type"] == "text" and not block["text"]):
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


async def read_stream(turn: Turn, stream: Any, response: StreamedAnswer) -> None:
    text_id: str | None = None
    thought_id: str | None = None
    try:
        async for event in stream:
            kind = event.type
            if kind == "content_block_delta":
                draft = response.blocks.get(event.index)
                if draft is None:
                    raise ProviderFault(MALFORMED_STREAM)
                delta = event.delta
                delta_kind = delta.type
                if delta_kind == "text_delta":
                    piece = _str(delta.text)
                    draft.block["text"] += piece
                    response.forwarded = True
                    text_id = await turn.send_text(piece, message_id=text_id)
                elif delta_kind == "thinking_delta":
                    piece = _str(delta.thinking)
                    draft.block["thinking"] += piece
                    response.forwarded = True
                    thought_id = await turn.send_thought(piece, message_id=thought_id)
                elif delta_kind == "signature_delta":
                    draft.block["signature"] += _str(delta.signature)
                elif delta_kind == "input_json_delta":
                    piece = _str(delta.partial_json)
                    draft.json_size += len(piece)
                    if draft.json_size <= MAX_ARGUMENT_CHARS:
                        draft.json_parts.append(piece)
            elif kind == "content_block_start":
                _start_block(response, event.index, event.content_block)
            elif kind == "message_start":
                _take_usage(response, event.message.usage)
            elif kind == "message_delta":
                response.stop_reason = _str(event.delta.stop_reason or "")
                _take_usage(response, event.usage)
            elif kind == "message_stop":
                response.complete = True
    except (AttributeError, TypeError, KeyError):
        raise ProviderFault(MALFORMED_STREAM) from None


def _start_block(response: StreamedAnswer, index: object, block: Any) -> None:
    if not isinstance(index, int) or index in response.blocks:
        raise ProviderFault(MALFORMED_STREAM)
    if len(response.blocks) >= MAX_BLOCKS_PER_RESPONSE:
        raise ProviderFault(MALFORMED_STREAM)
    kind = block.type
    if kind == "text":
        # Text arrives in deltas; a start carrying text is folded into the first one.
        response.blocks[index] = Draft({"type": "text", "text": ""})
    elif kind == "thinking":
        response.blocks[index] = Draft(
            {"type": "thinking", "thinking": "", "signature": _str(block.signature or "")}
        )
    elif kind == "redacted_thinking":
        # Encrypted thinking: never shown, but sent back as it came.
        response.blocks[index] = Draft({"type": "redacted_thinking", "data": _str(block.data)})
    elif kind == "tool_use":
        response.blocks[index] = Draft(
            {"type": "tool_use", "id": _str(block.id), "name": _str(block.name), "input": {}}
        )
    else:
        # A block kind this backend does not know is neither shown nor sent back.
        response.blocks[index] = Draft({"type": "ignored"})


def _take_usage(response: StreamedAnswer, usage: Any) -> None:
    if usage is None:
        return
    for name, field in (
        ("input_tokens", "input_tokens"),
        ("output_tokens", "output_tokens"),
        ("cache_read_input_tokens", "cache_read"),
        ("cache_creation_input_tokens", "cache_write"),
    ):
        value = getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            setattr(response, field, value)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ProviderFault(MALFORMED_STREAM)
    return value
