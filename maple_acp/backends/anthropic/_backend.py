"""The Anthropic Messages engine's side of a turn: the conversation rebuilt as Messages, one
streamed request (text and thinking forwarded as they come), what its stop reason means:
the turn goes on after ``tool_use`` (the same tools, modes and permission rules as the
OpenAI-compatible engine) and ``pause_turn``, and its side of a compaction (its estimate,
where its messages may be cut, its summary request). The rounds and the compaction's trigger
and bookkeeping are the provider layer's.

Thinking blocks arrive with a signature; the turn keeps each block exactly as streamed in the
messages it sends back, because a request continuing a tool loop must carry the thinking that
led to the tool call, signature intact. Usage carries the cache-read and cache-write tokens;
with configured prices the session's cumulative cost goes out with the context usage."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio

from maple_acp.backends.anthropic._client import MessagesClients, import_sdk, sdk_fault
from maple_acp.backends.anthropic._compaction import (
    after_summary,
    estimate,
    recent_start,
    summary_request,
)
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
    SUMMARY_MAX_TOKENS,
    SUMMARY_PREFIX,
    ModelPrices,
    ProviderConfig,
    ProviderEngine,
    ProviderEntry,
    ProviderFault,
    ProviderKeys,
    ToolCall,
    after_compaction,
    closing,
    kept_transcripts,
    offered_tools,
    raise_fault,
    where,
)
from maple_acp.model import TimelineItem
from maple_acp.runtime import StopReason, Turn

if TYPE_CHECKING:
    import anthropic

logger = logging.getLogger(__name__)

#: The answer's token bound (the Messages API requires one); thinking comes on top.
MAX_ANSWER_TOKENS = 8192
#: Thinking budget (tokens) of each thinking level a model marked ``reasoning = true`` offers.
THINKING_BUDGETS: Mapping[str, int] = {"low": 2048, "medium": 8192, "high": 24576}
#: Sessions whose running cost is remembered (the oldest is forgotten past this).
MAX_COSTED_SESSIONS = 4096


@attrs.define
class _Exchange:
    """One turn's Messages conversation, between its requests."""

    turn: Turn
    client: anthropic.AsyncAnthropic
    entry: ProviderEntry
    #: The model's id at the provider (without the provider's name).
    model: str
    system: str
    messages: list[Message]
    #: Where this run's part of ``messages`` starts (after its user message).
    mark: Mark
    window: int | None
    prices: ModelPrices | None
    #: The model is marked ``reasoning = true``: a thinking level applies to it.
    reasons: bool
    #: Each session's cost so far (the engine's, shared by its turns).
    costs: collections.OrderedDict[str, float]
    #: The provider's last count of the context used, or the estimate before a request.
    used: int = 0
    #: The shell's: this turn was compacted.
    compacted: bool = False

    def fresh(self) -> StreamedAnswer:
        return StreamedAnswer()

    def steer(self, items: Sequence[TimelineItem]) -> None:
        for item in items:
            user_text(self.messages, item.text)

    async def request(self) -> Callable[[StreamedAnswer], Coroutine[Any, Any, None]]:
        return partial(self.stream, self.messages)

    async def outcome(self, answer: StreamedAnswer, number: int) -> StopReason | list[ToolCall]:
        usage = answer.usage()
        if answer.usage_reported:
            await self.turn.report_usage(usage)
        cost = self._add_cost(answer)
        if self.window is not None and answer.usage_reported:
            self.used = usage.total_tokens
            await self.turn.report_context(
                usage.total_tokens, self.window, cost_usd=cost if self.prices is not None else None
            )
        stop = answer.stop_reason
        if stop in ("max_tokens", "model_context_window_exceeded"):
            return StopReason.MAX_TOKENS
        if stop == "refusal":
            return StopReason.REFUSAL
        calls = answer.tool_calls() if stop == "tool_use" else []
        if not calls and stop != "pause_turn":
            return StopReason.END_TURN
        return calls

    def add(self, answer: StreamedAnswer, told: Sequence[tuple[ToolCall, str]]) -> None:
        content = answer.content()
        if content:
            self.messages.append({"role": "assistant", "content": content})
        results: list[Block] = [
            {"type": "tool_result", "tool_use_id": call.call_id, "content": result}
            for call, result in told
        ]
        if results:
            self.messages.append({"role": "user", "content": results})

    def text(self, answer: StreamedAnswer) -> str:
        return answer.text()

    def transcript(self, answer: StreamedAnswer) -> list[Message]:
        sent = since(self.messages, self.mark)
        # The last answer's blocks: no request carried them yet.
        final = answer.content()
        if final:
            sent.append({"role": "assistant", "content": final})
        return sent

    def estimate(self) -> int:
        return estimate(self.system, self.messages)

    def request_estimate(self) -> int:
        # Sent as it is: this engine compacts but never trims.
        return self.estimate()

    def split(self) -> int | None:
        return recent_start(self.messages)

    async def summarize(self, cut: int, compaction_id: str) -> str:
        response = StreamedAnswer()
        await self.stream(summary_request(self.messages[:cut]), response, compaction_id)
        if response.usage_reported:
            await self.turn.report_usage(response.usage())
        self._add_cost(response)
        return response.text()

    def summarized(self, cut: int, summary: str) -> None:
        self.messages = after_summary(summary, self.messages[cut:])

    def _add_cost(self, answer: StreamedAnswer) -> float:
        if self.prices is None:
            return 0.0
        task_id = self.turn.task_id
        total = self.costs.pop(task_id, 0.0) + answer.cost(self.prices)
        self.costs[task_id] = total
        while len(self.costs) > MAX_COSTED_SESSIONS:
            self.costs.popitem(last=False)
        return total

    async def stream(
        self, messages: list[Message], response: StreamedAnswer, compaction_id: str | None = None
    ) -> None:
        """One request; with ``compaction_id`` it asks for a summary (no tools, no thinking,
        ``SUMMARY_MAX_TOKENS``), and its text is that compaction's, not the agent's."""
        turn = self.turn
        summary = compaction_id is not None
        # Read at each request: a mode or level chosen during the turn applies from the next.
        tools = [] if summary else tool_definitions(offered_tools(turn))
        system, marked_tools, marked = with_breakpoints(self.system, tools, messages)
        extra: dict[str, Any] = {"tools": marked_tools} if marked_tools else {}
        max_tokens = SUMMARY_MAX_TOKENS if summary else MAX_ANSWER_TOKENS
        budget = None if summary else THINKING_BUDGETS.get(turn.thought_level or "")
        if budget is not None and self.reasons:
            extra["thinking"] = {"type": "enabled", "budget_tokens": budget}
            max_tokens += budget
        # The body is plain JSON already: handed over as ``extra_body`` it skips the SDK's typed
        # walk of every message. ``messages`` there replaces the empty one the signature needs.
        body: dict[str, Any] = {"system": system, "messages": marked, **extra}
        create: Any = self.client.messages.with_streaming_response.create
        try:
            async with create(
                model=self.model,
                messages=(),
                max_tokens=max_tokens,
                stream=True,
                extra_body=body,
            ) as raw:
                http = raw.http_response
                chunks = http.aiter_bytes()
                await closing(http, read_stream(turn, chunks, response, compaction_id))
        except ProviderFault:
            raise
        except Exception as exc:
            raise_fault(sdk_fault(exc, where(self.entry), self.model), exc)
        if not response.complete:
            raise ProviderFault(BROKEN_STREAM, retryable=True)


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
    compacts = True
    transcript_format = TRANSCRIPT_FORMAT

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

    async def exchange(self, turn: Turn, entry: ProviderEntry, model: str) -> _Exchange:
        """The system prompt and messages of the turn's first request, and where this run's
        part of them starts (after its user message): what a transcript of the run keeps."""
        summary, history = after_compaction(turn.history)
        transcripts = await kept_transcripts(turn, history, TRANSCRIPT_FORMAT)
        system = self.system_prompt(turn, turn.history, transcripts)
        sources = await self.images(turn, history, image_source)
        messages: list[Message] = []
        if summary is not None:
            # The summary stands for what it covers (whichever engine compacted).
            user_text(messages, SUMMARY_PREFIX + summary)
        mark = replay_history(history, messages, sources, transcripts, turn.run_id)
        user_text(messages, self.prompt_text(turn), turn.images, sources)
        settings = entry.settings_for(model)
        return _Exchange(
            turn,
            self._clients.get(entry),
            entry,
            model,
            system,
            messages,
            end_of(messages) if mark is None else mark,
            self.window(entry, model),
            settings.prices if settings else None,
            bool(self.thought_levels(turn.model)),
            self._costs,
        )
