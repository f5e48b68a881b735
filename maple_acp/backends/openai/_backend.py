"""The OpenAI-compatible engine's side of a turn: the conversation rebuilt as Chat
Completions messages, one streamed request (text and reasoning forwarded as they come), what
its finish reason and tool calls mean, and its side of a compaction (its estimate, where its
messages may be cut, its summary request). The rounds and the shell around them (target,
system prompt, retries, tool runs, compaction, the turn's end) are the provider layer's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from maple_acp.backends.openai._client import ProviderClients, SdkLoader, sdk_fault
from maple_acp.backends.openai._compaction import head_of, recent_start, summary_message
from maple_acp.backends.openai._conversation import (
    TRANSCRIPT_FORMAT,
    Message,
    data_url,
    estimate_tokens,
    fit_to_window,
    history_messages,
    replayed_messages,
    user_message,
)
from maple_acp.backends.openai._stream import StreamedAnswer, read_answer
from maple_acp.backends.provider import (
    BROKEN_STREAM,
    OPENAI_KIND,
    SUMMARY_MAX_TOKENS,
    SUMMARY_REQUEST,
    ProviderConfig,
    ProviderEngine,
    ProviderEntry,
    ProviderFault,
    ProviderKeys,
    TlsContext,
    ToolCall,
    after_compaction,
    closing,
    kept_transcripts,
    offered_tools,
    raise_fault,
    where,
)
from maple_acp.model import TimelineItem
from maple_acp.runtime import StopReason, Turn, TurnFailed

if TYPE_CHECKING:
    import openai

logger = logging.getLogger(__name__)

#: Part of a known context window kept free for the model's answer when trimming.
ANSWER_RESERVE_FRACTION = 0.25
#: The thinking levels of a model marked ``reasoning = true``: the values of the Chat
#: Completions ``reasoning_effort`` every reasoning model takes.
REASONING_EFFORTS = ("low", "medium", "high")


@attrs.define
class _Exchange:
    """One turn's Chat Completions conversation, between its requests."""

    turn: Turn
    client: openai.AsyncOpenAI
    entry: ProviderEntry
    #: The model's id at the provider (without the provider's name).
    model: str
    window: int | None
    messages: list[Message]
    #: Where this run's part of ``messages`` starts (after its user message).
    mark: int
    #: The provider's last count of the context used, or the estimate before a request.
    used: int = 0
    #: The shell's: this turn was compacted.
    compacted: bool = False
    #: The estimated tokens of the request last built (after the trim to the window).
    sent_estimate: int = 0

    def fresh(self) -> StreamedAnswer:
        return StreamedAnswer()

    def steer(self, items: Sequence[TimelineItem]) -> None:
        self.messages.extend(history_messages(items))

    async def request(self) -> Callable[[StreamedAnswer], Coroutine[Any, Any, None]]:
        sent = self.messages
        if self.window is not None:
            sent = fit_to_window(self.messages, int(self.window * (1 - ANSWER_RESERVE_FRACTION)))
        self.sent_estimate = sum(estimate_tokens(message) for message in sent)
        return partial(self.stream, sent)

    def request_estimate(self) -> int:
        return self.sent_estimate

    async def outcome(self, answer: StreamedAnswer, number: int) -> StopReason | list[ToolCall]:
        if answer.usage is not None:
            await self.turn.report_usage(answer.usage)
        if self.window is not None and answer.context_used is not None:
            await self.turn.report_context(answer.context_used, self.window)
            self.used = answer.context_used
        if answer.finish_reason == "length":
            return StopReason.MAX_TOKENS
        if answer.finish_reason == "content_filter":
            return StopReason.REFUSAL
        return answer.tool_calls(number) or StopReason.END_TURN

    def add(self, answer: StreamedAnswer, told: Sequence[tuple[ToolCall, str]]) -> None:
        self.messages.append(
            {
                # A string, never null: chat templates that join the content as text
                # (llama.cpp's Python server) fail on null, and an empty string is what
                # every server takes with tool calls.
                "role": "assistant",
                "content": self.text(answer),
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments or "{}"},
                    }
                    for call, _ in told
                ],
            }
        )
        for call, result in told:
            self.messages.append({"role": "tool", "tool_call_id": call.call_id, "content": result})

    def text(self, answer: StreamedAnswer) -> str:
        return "".join(answer.text)

    def transcript(self, answer: StreamedAnswer) -> list[Message] | None:
        text = self.text(answer)
        final = [{"role": "assistant", "content": text}] if text else []
        return [*self.messages[self.mark :], *final]

    def estimate(self) -> int:
        return sum(estimate_tokens(message) for message in self.messages)

    def split(self) -> int | None:
        return recent_start(self.messages)

    async def summarize(self, cut: int, compaction_id: str) -> str:
        request = [*self.messages[:cut], {"role": "user", "content": SUMMARY_REQUEST}]
        if self.window is not None:
            request = fit_to_window(request, int(self.window * (1 - ANSWER_RESERVE_FRACTION)))
        response = StreamedAnswer()
        await self.stream(request, response, compaction_id=compaction_id)
        if response.usage is not None:
            await self.turn.report_usage(response.usage)
        return "".join(response.text)

    def summarized(self, cut: int, summary: str) -> None:
        head = head_of(self.messages)
        self.messages = [*self.messages[:head], summary_message(summary), *self.messages[cut:]]

    async def stream(
        self,
        messages: list[Message],
        response: StreamedAnswer,
        *,
        compaction_id: str | None = None,
    ) -> None:
        """One request through the SDK's raw-response path (its authentication, base URL and
        status errors), the answer read as bytes; with ``compaction_id`` it asks for a
        summary (no tools), and its text is that compaction's, not the agent's."""
        # Messages and tools are plain dicts built here; the SDK's typed overloads add nothing.
        create: Any = self.client.chat.completions.with_streaming_response.create
        # Read at each request: a mode or effort chosen during the turn applies from the next.
        tools = offered_tools(self.turn) if compaction_id is None else []
        # The body is plain JSON already: handed over as ``extra_body`` it skips the SDK's
        # typed walk of every message, which costs milliseconds per request on a long
        # conversation. ``messages`` there replaces the empty one given for the signature.
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        if compaction_id is not None:
            # The agent's own answers are left to the server's bound; a summary is not. A
            # model marked reasoning takes the bound as max_completion_tokens (OpenAI's
            # reasoning models refuse max_tokens); local servers know max_tokens.
            settings = self.entry.settings_for(self.model)
            reasoning = settings is not None and settings.reasoning
            body["max_completion_tokens" if reasoning else "max_tokens"] = SUMMARY_MAX_TOKENS
        effort = self.turn.thought_level
        if effort is not None:
            body["reasoning_effort"] = effort
        try:
            async with create(
                model=self.model,
                messages=(),
                stream=True,
                stream_options={"include_usage": True},
                extra_body=body,
            ) as raw:
                http = raw.http_response
                chunks = http.aiter_bytes()
                await closing(http, read_answer(self.turn, chunks, response, compaction_id))
        except ProviderFault:
            raise
        except Exception as exc:
            raise_fault(sdk_fault(exc, where(self.entry), self.model), exc)
        if not response.done and response.finish_reason is None:
            # A server that fails after sending its headers ends the body early (even with
            # nothing in it): that is a broken answer, not an empty one.
            raise ProviderFault(BROKEN_STREAM, retryable=True)


class ProviderBackend(ProviderEngine):
    """An ``AgentBackend`` over OpenAI-compatible Chat Completions endpoints.

    Resource handling: one HTTP client per provider serves every turn (pooled keep-alive
    connections); ``async with backend`` (or :meth:`aclose`) closes them all, and
    :meth:`warm_up` makes them (importing the SDK in a worker thread) before the first turn
    needs them. Every stream is closed when its request ends, is cancelled or fails; a
    cancelled turn's stream is closed at once, so the provider sees its connection end.

    Error handling and cancellation: the shell's (``ProviderEngine``)."""

    kind = OPENAI_KIND
    levels = REASONING_EFFORTS
    compacts = True
    transcript_format = TRANSCRIPT_FORMAT

    _clients: ProviderClients

    def __init__(
        self,
        config: ProviderConfig,
        keys: ProviderKeys,
        *,
        sdk: SdkLoader | None = None,
        **shell: Any,
    ) -> None:
        #: The SDK's one import, shared with the catalog (``build_backend``).
        self._sdk = sdk
        super().__init__(config, keys, **shell)

    def open_clients(self) -> ProviderClients:
        return ProviderClients(self._keys, self._timeouts, TlsContext(), self._sdk)

    async def prepare(self) -> None:
        await self._clients.warm_up(self._entries())

    async def exchange(self, turn: Turn, entry: ProviderEntry, model: str) -> _Exchange:
        messages, mark = await self._conversation(turn)
        try:
            client = await self._clients.get(entry)
        except ProviderFault as fault:
            raise TurnFailed(fault.line) from None
        return _Exchange(turn, client, entry, model, self.window(entry, model), messages, mark)

    async def _conversation(self, turn: Turn) -> tuple[list[Message], int]:
        """The messages of the turn's first request, and where this run's part of them
        starts (after its user message): what a transcript of the run keeps."""
        summary, history = after_compaction(turn.history)
        transcripts = await kept_transcripts(turn, history, TRANSCRIPT_FORMAT)
        system = self.system_prompt(turn, turn.history, transcripts)
        urls = await self.images(turn, history, data_url)
        replayed, mark = replayed_messages(history, urls, transcripts, turn.run_id)
        head: list[Message] = [
            {"role": "system", "content": system},
            *([summary_message(summary)] if summary is not None else []),
        ]
        messages = [*head, *replayed, user_message(self.prompt_text(turn), turn.images, urls)]
        return messages, len(messages) if mark is None else len(head) + mark
