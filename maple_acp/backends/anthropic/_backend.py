"""The turn loop of the Anthropic Messages engine: rebuild the conversation, stream one
Messages request, forward text and thinking, run the tool calls it asked for (the same tools,
modes and permission rules as the OpenAI-compatible engine), and go again until the model
stops for another reason than ``tool_use`` (or a bound or a fault ends the turn).

Thinking blocks arrive with a signature; the turn keeps each block exactly as streamed in the
messages it sends back, because a request continuing a tool loop must carry the thinking that
led to the tool call, signature intact. Usage carries the cache-read and cache-write tokens;
with configured prices the session's cumulative cost goes out with the context usage."""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio

from maple_acp.backends.anthropic._client import MessagesClients, import_sdk, sdk_fault
from maple_acp.backends.anthropic._messages import (
    TRANSCRIPT_FORMAT,
    Block,
    Mark,
    Message,
    end_of,
    image_source,
    replay_history,
    since,
    tool_definitions,
    user_text,
    with_breakpoints,
)
from maple_acp.backends.anthropic._stream import StreamedAnswer, read_stream
from maple_acp.backends.provider import (
    ANTHROPIC_KIND,
    BROKEN_STREAM,
    SUMMARY_PREFIX,
    ModelPrices,
    ProviderConfig,
    ProviderEngine,
    ProviderEntry,
    ProviderFault,
    ProviderKeys,
    after_compaction,
    closing,
    kept_transcripts,
    offered_tools,
    raise_fault,
    where,
)
from maple_acp.runtime import StopReason, Turn, TurnResult

if TYPE_CHECKING:
    import anthropic

logger = logging.getLogger(__name__)

#: The answer's token bound (the Messages API requires one); thinking comes on top.
MAX_ANSWER_TOKENS = 8192
#: Thinking budget (tokens) of each thinking level a model marked ``reasoning = true`` offers.
THINKING_BUDGETS: Mapping[str, int] = {"low": 2048, "medium": 8192, "high": 24576}
#: Sessions whose running cost is remembered (the oldest is forgotten past this).
MAX_COSTED_SESSIONS = 4096


@attrs.frozen
class _Exchange:
    """What stays the same across one turn's model requests."""

    turn: Turn
    client: anthropic.AsyncAnthropic
    entry: ProviderEntry
    #: The model's id at the provider (without the provider's name).
    model: str
    system: str


class AnthropicBackend(ProviderEngine):
    """An ``AgentBackend`` over Anthropic Messages endpoints (``kind = "anthropic"``).

    Resource handling: one SDK client per provider for the backend's life; use the backend as
    ``async with backend:`` (or ``await backend.aclose()``) so that they close, explicitly (the
    SDK's own clean-up runs only under asyncio). Every stream is closed when its request ends,
    is cancelled or fails; a cancelled turn's stream at once, so the provider sees its
    connection end.

    Error handling and cancellation: the shell's (``ProviderEngine``); an overload (529, or
    an error event before anything was forwarded) is a rate limit like a 429."""

    kind = ANTHROPIC_KIND
    levels = tuple(THINKING_BUDGETS)

    _clients: MessagesClients

    def __init__(self, config: ProviderConfig, keys: ProviderKeys, **shell: Any) -> None:
        super().__init__(config, keys, **shell)
        #: Each session's cost so far in USD (only for models with configured prices).
        self._costs: collections.OrderedDict[str, float] = collections.OrderedDict()

    def open_clients(self) -> MessagesClients:
        return MessagesClients(self._keys, self._timeouts)

    async def prepare(self) -> None:
        await trio.to_thread.run_sync(import_sdk)
        for entry in self._entries():
            self._clients.get(entry)

    async def run_turn(self, turn: Turn) -> TurnResult:
        entry, model = self.target(turn)
        system, messages, mark = await self._conversation(turn)
        exchange = _Exchange(turn, self._clients.get(entry), entry, model, system)
        answer, stop, final = await self._loop(exchange, messages)
        sent = since(messages, mark)
        if final:
            sent.append({"role": "assistant", "content": final})
        await self.keep(turn, TRANSCRIPT_FORMAT, sent)
        return self.ended(turn, answer, stop)

    async def _conversation(self, turn: Turn) -> tuple[str, list[Message], Mark]:
        """The system prompt and messages of the turn's first request, and where this run's
        part of them starts (after its user message): what a transcript of the run keeps."""
        summary, history = after_compaction(turn.history)
        transcripts = await kept_transcripts(turn, history, TRANSCRIPT_FORMAT)
        system = self.system_prompt(turn, turn.history, transcripts)
        sources = await self.images(turn, history, image_source)
        messages: list[Message] = []
        if summary is not None:
            # Compacted by the OpenAI-compatible engine: the summary stands for what it covers.
            user_text(messages, SUMMARY_PREFIX + summary)
        mark = replay_history(history, messages, sources, transcripts, turn.run_id)
        user_text(messages, self.prompt_text(turn), turn.images, sources)
        return system, messages, end_of(messages) if mark is None else mark

    async def _loop(
        self, exchange: _Exchange, messages: list[Message]
    ) -> tuple[str, StopReason, list[Block]]:
        """The model's last answer text, why the turn stops, and its last answer's blocks (not
        in ``messages``: no request carried them yet)."""
        turn = exchange.turn
        settings = exchange.entry.settings_for(exchange.model)
        window = (settings.context_window if settings else None) or exchange.entry.context_window
        prices = settings.prices if settings else None
        answer = ""
        for number in range(1, self._max_requests + 1):
            # What the user added while the turn worked goes in before the next request.
            for item in turn.steering():
                user_text(messages, item.text)
            response = await self.retried(
                turn, exchange.entry, StreamedAnswer, partial(self._stream, exchange, messages)
            )
            usage = response.usage()
            if response.usage_reported:
                await turn.report_usage(usage)
            cost = self._add_cost(turn.task_id, response, prices)
            if window is not None and response.usage_reported:
                await turn.report_context(
                    usage.total_tokens, window, cost_usd=cost if prices is not None else None
                )
            answer = response.text()
            content = response.content()
            stop = response.stop_reason
            if stop in ("max_tokens", "model_context_window_exceeded"):
                return answer, StopReason.MAX_TOKENS, content
            if stop == "refusal":
                return answer, StopReason.REFUSAL, content
            calls = response.tool_calls() if stop == "tool_use" else []
            if not calls and stop != "pause_turn":
                return answer, StopReason.END_TURN, content
            if number == self._max_requests:
                return answer, StopReason.MAX_TURN_REQUESTS, content
            if content:
                messages.append({"role": "assistant", "content": content})
            results: list[Block] = [
                {"type": "tool_result", "tool_use_id": call.call_id, "content": told}
                for call, told in await self.run_tools(turn, calls)
            ]
            if results:
                messages.append({"role": "user", "content": results})
        return answer, StopReason.END_TURN, []

    def _add_cost(
        self, task_id: str, response: StreamedAnswer, prices: ModelPrices | None
    ) -> float:
        if prices is None:
            return 0.0
        total = self._costs.pop(task_id, 0.0) + response.cost(prices)
        self._costs[task_id] = total
        while len(self._costs) > MAX_COSTED_SESSIONS:
            self._costs.popitem(last=False)
        return total

    async def _stream(
        self, exchange: _Exchange, messages: list[Message], response: StreamedAnswer
    ) -> None:
        turn = exchange.turn
        # Read at each request: a mode or level chosen during the turn applies from the next.
        tools = tool_definitions(offered_tools(turn))
        system, marked_tools, marked = with_breakpoints(exchange.system, tools, messages)
        extra: dict[str, Any] = {"tools": marked_tools} if marked_tools else {}
        max_tokens = MAX_ANSWER_TOKENS
        budget = THINKING_BUDGETS.get(turn.thought_level or "")
        if budget is not None and self.thought_levels(turn.model):
            extra["thinking"] = {"type": "enabled", "budget_tokens": budget}
            max_tokens += budget
        # The body is plain JSON already: handed over as ``extra_body`` it skips the SDK's typed
        # walk of every message. ``messages`` there replaces the empty one the signature needs.
        body: dict[str, Any] = {"system": system, "messages": marked, **extra}
        create: Any = exchange.client.messages.with_streaming_response.create
        try:
            async with create(
                model=exchange.model,
                messages=(),
                max_tokens=max_tokens,
                stream=True,
                extra_body=body,
            ) as raw:
                http = raw.http_response
                await closing(http, read_stream(turn, http.aiter_bytes(), response))
        except ProviderFault:
            raise
        except Exception as exc:
            raise_fault(sdk_fault(exc, where(exchange.entry), exchange.model), exc)
        if not response.complete:
            raise ProviderFault(BROKEN_STREAM, retryable=True)
