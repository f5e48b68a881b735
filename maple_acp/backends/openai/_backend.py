"""The turn loop of the OpenAI-compatible engine: rebuild the conversation, stream one Chat
Completions request, forward text and reasoning, run the tool calls it asked for, and go
again until the model answers without tools (or a bound or a fault ends the turn). Compaction
of a long conversation is this engine's too. The shell around it (target, system prompt,
retries, the turn's end) is the provider layer's."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from maple_acp.backends.openai._client import ProviderClients, SdkLoader, sdk_fault
from maple_acp.backends.openai._compaction import (
    COMPACT_AT_FRACTION,
    SUMMARY_REQUEST,
    split_for_compaction,
    summary_message,
)
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
    COMPACT_COMMAND,
    OPENAI_KIND,
    ProviderConfig,
    ProviderEngine,
    ProviderEntry,
    ProviderFault,
    ProviderKeys,
    TlsContext,
    after_compaction,
    closing,
    kept_transcripts,
    offered_tools,
    raise_fault,
    where,
)
from maple_acp.runtime import CommandInfo, RunKind, StopReason, Turn, TurnFailed, TurnResult

if TYPE_CHECKING:
    import openai

logger = logging.getLogger(__name__)

#: Part of a known context window kept free for the model's answer when trimming.
ANSWER_RESERVE_FRACTION = 0.25
#: The thinking levels of a model marked ``reasoning = true``: the values of the Chat
#: Completions ``reasoning_effort`` every reasoning model takes.
REASONING_EFFORTS = ("low", "medium", "high")


@attrs.frozen
class _Exchange:
    """What stays the same across one turn's model requests."""

    turn: Turn
    client: openai.AsyncOpenAI
    entry: ProviderEntry
    #: The model's id at the provider (without the provider's name).
    model: str
    window: int | None


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

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return (
            CommandInfo(
                name=COMPACT_COMMAND[1:],
                description="Summarize the conversation so far, to free the context window",
            ),
        )

    async def run_turn(self, turn: Turn) -> TurnResult:
        entry, model = self.target(turn)
        messages, mark = await self._conversation(turn)
        forced = turn.kind is RunKind.PROMPT and turn.prompt.strip() == COMPACT_COMMAND
        try:
            client = await self._clients.get(entry)
        except ProviderFault as fault:
            raise TurnFailed(fault.line) from None
        exchange = _Exchange(turn, client, entry, model, self.window(entry, model))
        if forced:
            if await self._compact(exchange, messages) is None:
                await turn.notice("There is nothing to compact yet.")
            return TurnResult()
        answer, stop, sent = await self._loop(exchange, messages)
        if sent is not None:
            final = [{"role": "assistant", "content": answer}] if answer else []
            await self.keep(turn, TRANSCRIPT_FORMAT, [*sent[mark:], *final])
        return self.ended(turn, answer, stop)

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

    async def _loop(
        self, exchange: _Exchange, messages: list[Message]
    ) -> tuple[str, StopReason, list[Message] | None]:
        """The model's last answer text, why the turn stops, and the messages sent (``None``
        when a compaction replaced them)."""
        turn, window = exchange.turn, exchange.window
        answer = ""
        used = 0
        compacted = False

        def kept() -> list[Message] | None:
            return None if compacted else messages

        for number in range(1, self._max_requests + 1):
            # What the user added while the turn worked goes in before the next request.
            messages.extend(history_messages(turn.steering()))
            if window is not None and not compacted:
                # At most once a turn: what is left after one is this turn's own work.
                used = max(used, sum(estimate_tokens(message) for message in messages))
                if used >= window * COMPACT_AT_FRACTION:
                    compacted = True
                    messages = await self._compact(exchange, messages) or messages
            sent = messages
            if window is not None:
                sent = fit_to_window(messages, int(window * (1 - ANSWER_RESERVE_FRACTION)))
            response = await self.retried(
                turn, exchange.entry, StreamedAnswer, partial(self._stream, exchange, sent)
            )
            if response.usage is not None:
                await turn.report_usage(response.usage)
            if window is not None and response.context_used is not None:
                await turn.report_context(response.context_used, window)
                used = response.context_used
            answer = "".join(response.text)
            if response.finish_reason == "length":
                return answer, StopReason.MAX_TOKENS, kept()
            if response.finish_reason == "content_filter":
                return answer, StopReason.REFUSAL, kept()
            calls = response.tool_calls(number)
            if not calls:
                return answer, StopReason.END_TURN, kept()
            if number == self._max_requests:
                return answer, StopReason.MAX_TURN_REQUESTS, kept()
            messages.append(
                {
                    # A string, never null: chat templates that join the content as text
                    # (llama.cpp's Python server) fail on null, and an empty string is
                    # what every server takes with tool calls.
                    "role": "assistant",
                    "content": answer,
                    "tool_calls": [
                        {
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments or "{}"},
                        }
                        for call in calls
                    ],
                }
            )
            for call, told in await self.run_tools(turn, calls):
                messages.append({"role": "tool", "tool_call_id": call.call_id, "content": told})
        return answer, StopReason.END_TURN, kept()

    async def _compact(self, exchange: _Exchange, messages: list[Message]) -> list[Message] | None:
        """Have the model summarize the older part of ``messages`` as a compaction of the
        turn; the messages to go on with (system prompt, summary, recent part), or ``None``
        when there is nothing older or the summary failed (the turn goes on without it)."""
        split = split_for_compaction(messages)
        if split is None:
            return None
        head, older, recent = split
        turn = exchange.turn
        request = [*head, *older, {"role": "user", "content": SUMMARY_REQUEST}]
        if exchange.window is not None:
            budget = int(exchange.window * (1 - ANSWER_RESERVE_FRACTION))
            request = fit_to_window(request, budget)
        compaction_id = await turn.start_compaction()
        response = StreamedAnswer()
        try:
            await self._stream(exchange, request, response, compaction_id=compaction_id)
        except ProviderFault as fault:
            await turn.end_compaction(compaction_id, error=fault.line)
            return None
        if response.usage is not None:
            await turn.report_usage(response.usage)
        if not await turn.end_compaction(compaction_id):
            return None
        return [*head, summary_message("".join(response.text)), *recent]

    async def _stream(
        self,
        exchange: _Exchange,
        messages: list[Message],
        response: StreamedAnswer,
        *,
        compaction_id: str | None = None,
    ) -> None:
        """One request through the SDK's raw-response path (its authentication, base URL and
        status errors), the answer read as bytes (``_stream``); with ``compaction_id`` it asks
        for a summary (no tools), and its text is that compaction's, not the agent's."""
        # Messages and tools are plain dicts built here; the SDK's typed overloads add nothing.
        create: Any = exchange.client.chat.completions.with_streaming_response.create
        # Read at each request: a mode or effort chosen during the turn applies from the next.
        tools = offered_tools(exchange.turn) if compaction_id is None else []
        # The body is plain JSON already: handed over as ``extra_body`` it skips the SDK's
        # typed walk of every message, which costs milliseconds per request on a long
        # conversation. ``messages`` there replaces the empty one given for the signature.
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        effort = exchange.turn.thought_level
        if effort is not None:
            body["reasoning_effort"] = effort
        try:
            async with create(
                model=exchange.model,
                messages=(),
                stream=True,
                stream_options={"include_usage": True},
                extra_body=body,
            ) as raw:
                http = raw.http_response
                chunks = http.aiter_bytes()
                await closing(http, read_answer(exchange.turn, chunks, response, compaction_id))
        except ProviderFault:
            raise
        except Exception as exc:
            raise_fault(sdk_fault(exc, where(exchange.entry), exchange.model), exc)
        if not response.done and response.finish_reason is None:
            # A server that fails after sending its headers ends the body early (even with
            # nothing in it): that is a broken answer, not an empty one.
            raise ProviderFault(BROKEN_STREAM, retryable=True)
