"""The turn loop of the OpenAI-compatible backend: rebuild the conversation, stream one model
request, forward text and reasoning, run the tool calls it asked for, and go again until the
model answers without tools (or a bound or a fault ends the turn)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import trio

from maple_acp._groups import single_exception
from maple_acp.backends.openai._client import (
    ProviderClients,
    ProviderKeys,
    RequestTimeouts,
    SdkLoader,
    TlsContext,
    sdk_fault,
    where,
)
from maple_acp.backends.openai._compaction import (
    COMPACT_AT_FRACTION,
    COMPACT_COMMAND,
    SUMMARY_REQUEST,
    after_compaction,
    split_for_compaction,
    summary_message,
)
from maple_acp.backends.openai._config import (
    ModelSettings,
    ProviderConfig,
    ProviderEntry,
    split_model_id,
)
from maple_acp.backends.openai._conversation import (
    TRANSCRIPT_FORMAT,
    Message,
    bound_result,
    data_url,
    encode_transcript,
    estimate_tokens,
    fit_to_window,
    history_messages,
    kept_transcripts,
    replayed_messages,
    user_message,
    wanted_images,
)
from maple_acp.backends.openai._faults import (
    BACKOFF_S,
    BROKEN_STREAM,
    MALFORMED_STREAM,
    ProviderFault,
    retrying,
)
from maple_acp.backends.openai._native import offered_tools, run_tool_call
from maple_acp.backends.openai._stream import StreamedAnswer, read_answer
from maple_acp.model import ItemKind
from maple_acp.runtime import (
    CommandInfo,
    GoalProgress,
    GoalStatus,
    PromptCapabilities,
    RunKind,
    StopReason,
    Turn,
    TurnFailed,
    TurnResult,
)

if TYPE_CHECKING:
    import openai

logger = logging.getLogger(__name__)

#: Model requests in one turn; the next one would end the turn as ``max_turn_requests``.
MAX_TURN_REQUESTS = 64
#: Closing a stream's connection after a cancel or a fault: shielded, but never for long.
STREAM_CLOSE_BOUND_S = 1.0
#: A request with nothing streamed back after this long gets a notice: without one the user
#: sees only silence while a cold local model loads or a busy provider queues the request.
SLOW_ANSWER_NOTICE_S = 5.0
#: Part of a known context window kept free for the model's answer when trimming.
ANSWER_RESERVE_FRACTION = 0.25

DEFAULT_SYSTEM_PROMPT = (
    "You are a coding assistant working in the project directory {root}. Use the tools to "
    "read files, change them and run commands there; give paths relative to that directory. "
    "Be brief, and say what you changed."
)
PLANNING_PROMPT = (
    "The session is in plan mode: do not change anything. Read what you need, then work out "
    "a plan with update_plan and explain it; the user switches modes to carry it out."
)
#: The thinking levels of a model marked ``reasoning = true``: the values of the Chat
#: Completions ``reasoning_effort`` every reasoning model takes.
REASONING_EFFORTS = ("low", "medium", "high")
GOAL_PROMPT = (
    "Keep working toward this goal: {objective}\n"
    "End your answer with one line: GOAL COMPLETE when it is achieved, GOAL BLOCKED when you "
    "cannot go on without the user, or GOAL CONTINUE when more work remains."
)


@attrs.frozen
class _Exchange:
    """What stays the same across one turn's model requests."""

    turn: Turn
    client: openai.AsyncOpenAI
    entry: ProviderEntry
    #: The model's id at the provider (without the provider's name).
    model: str


class ProviderBackend:
    """An ``AgentBackend`` over OpenAI-compatible Chat Completions endpoints.

    Resource handling: one HTTP client per provider serves every turn (pooled keep-alive
    connections); ``async with backend`` (or :meth:`aclose`) closes them all, and
    :meth:`warm_up` makes them (importing the SDK in a worker thread) before the first turn
    needs them. Every stream is closed when its request ends, is cancelled or fails; a
    cancelled turn's stream is closed at once, so the provider sees its connection end.

    Error handling: provider faults end the turn with ``TurnFailed`` and one safe line (never
    the key or the provider's own error text). Rate limits, server errors and lost connections
    before any of the answer was forwarded are retried (``_faults``); nothing else is. A rate
    limit resetting past the retry bound is waited out up to the configuration's
    ``max_rate_limit_wait``, inside the run's scope, so a cancel ends the wait at once.
    """

    def __init__(
        self,
        config: ProviderConfig,
        keys: ProviderKeys,
        *,
        timeouts: RequestTimeouts | None = None,
        max_turn_requests: int = MAX_TURN_REQUESTS,
        backoff: Sequence[float] = BACKOFF_S,
        sdk: SdkLoader | None = None,
    ) -> None:
        self._config = config
        self._keys = keys
        self._timeouts = timeouts or RequestTimeouts()
        self._max_requests = max(1, min(max_turn_requests, MAX_TURN_REQUESTS))
        #: Waits before retries 1, 2, 3 when the provider names none.
        self._backoff = tuple(backoff) or BACKOFF_S
        self._clients = ProviderClients(keys, self._timeouts, TlsContext(), sdk)

    async def warm_up(self) -> None:
        """Import the SDK and make every provider's client, ahead of the first turn (a host
        starts this once it serves). Never raises: a turn meets the same failure and says it."""
        try:
            await self._clients.warm_up(self._config.providers)
        except Exception as exc:
            logger.warning("could not prepare the provider clients ahead (%s)", type(exc).__name__)

    async def aclose(self) -> None:
        """Close every provider's client and its connections."""
        await self._clients.aclose()

    async def __aenter__(self) -> ProviderBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return (
            CommandInfo(
                name=COMPACT_COMMAND[1:],
                description="Summarize the conversation so far, to free the context window",
            ),
        )

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        """Embedded text resources always; images when a configured model is marked
        ``vision = true`` (``accepts_images`` then says which)."""
        sees = any(
            settings.vision for entry in self._config.providers for settings in entry.model_settings
        )
        return PromptCapabilities(image=sees, embedded_context=True)

    def _settings(self, model_id: str | None) -> ModelSettings | None:
        try:
            provider_name, model = split_model_id(model_id or self._config.default_model)
        except ValueError:
            return None
        entry = self._config.provider(provider_name)
        return entry.settings_for(model) if entry is not None else None

    def accepts_images(self, model_id: str | None) -> bool:
        """Whether the configuration marks the model ``vision = true``."""
        settings = self._settings(model_id)
        return settings is not None and settings.vision

    def thought_levels(self, model_id: str | None) -> tuple[str, ...]:
        """``REASONING_EFFORTS`` for a configured model marked ``reasoning = true``, else
        none."""
        settings = self._settings(model_id)
        return REASONING_EFFORTS if settings is not None and settings.reasoning else ()

    async def run_turn(self, turn: Turn) -> TurnResult:
        model_id = turn.model or self._config.default_model
        try:
            provider_name, model = split_model_id(model_id)
        except ValueError:
            raise TurnFailed(f"the model id {model_id[:200]!r} is not provider/model") from None
        entry = self._config.provider(provider_name)
        if entry is None:
            raise TurnFailed(f"the model {model_id[:200]!r} is no longer configured")
        messages, mark = await self._conversation(turn, self.accepts_images(model_id))
        forced = turn.kind is RunKind.PROMPT and turn.prompt.strip() == COMPACT_COMMAND
        try:
            client = await self._clients.get(entry)
        except ProviderFault as fault:
            raise TurnFailed(fault.line) from None
        exchange = _Exchange(turn, client, entry, model)
        if forced:
            if await self._compact(exchange, messages) is None:
                await turn.notice("There is nothing to compact yet.")
            return TurnResult()
        answer, stop, sent = await self._loop(exchange, messages)
        if sent is not None:
            # Later turns send this run's part again as it went, byte for byte: the model
            # sees the same results, and the provider's prompt cache still matches.
            final = [{"role": "assistant", "content": answer}] if answer else []
            await turn.keep_transcript(encode_transcript(TRANSCRIPT_FORMAT, [*sent[mark:], *final]))
        if stop is not StopReason.END_TURN:
            logger.info("turn %s stopped: %s", turn.run_id, stop.value)
        progress = _goal_progress(answer) if turn.kind is RunKind.GOAL_CYCLE else None
        return TurnResult(stop_reason=stop, goal_progress=progress)

    async def _conversation(self, turn: Turn, sees: bool) -> tuple[list[Message], int]:
        """The messages of the turn's first request, and where this run's part of them
        starts (after its user message): what a transcript of the run keeps."""
        system = self._config.system_prompt or DEFAULT_SYSTEM_PROMPT.format(root=turn.root)
        if turn.skills:
            listed = "\n".join(f"- {skill.name}: {skill.path}" for skill in turn.skills)
            system += (
                f"\n\nProject skills (read a skill's file when the task matches it):\n{listed}"
            )
        if turn.planning:
            system += f"\n\n{PLANNING_PROMPT}"
        summary, history = after_compaction(turn.history)
        transcripts = await kept_transcripts(turn, history)
        plans = [item for item in turn.history if item.kind is ItemKind.PLAN and item.plan]
        if plans and plans[-1].run_id not in transcripts:
            # A plan is not a message a provider accepts back; the model still should know it
            # (unless the run that made it is sent as it was, its update_plan call included).
            steps = "\n".join(f"- [{e.status.value}] {e.content}" for e in plans[-1].plan)
            system += f"\n\nYour plan so far (update it with update_plan):\n{steps}"
        prompt = turn.prompt
        if turn.kind is RunKind.GOAL_CYCLE:
            prompt = GOAL_PROMPT.format(objective=turn.prompt)
        # Images go as data URLs, read once per turn (none for a model that does not see).
        urls: dict[str, str] = {}
        for image in wanted_images(history, turn.images) if sees else ():
            data = await turn.image_data(image)
            if data is not None:
                urls[image.sha256] = data_url(image, data)
        replayed, mark = replayed_messages(history, urls, transcripts, turn.run_id)
        head: list[Message] = [
            {"role": "system", "content": system},
            *([summary_message(summary)] if summary is not None else []),
        ]
        messages = [*head, *replayed, user_message(prompt, turn.images, urls)]
        return messages, len(messages) if mark is None else len(head) + mark

    async def _loop(
        self, exchange: _Exchange, messages: list[Message]
    ) -> tuple[str, StopReason, list[Message] | None]:
        """The model's last answer text, why the turn stops, and the messages sent (``None``
        when a compaction replaced them)."""
        turn = exchange.turn
        window = self._window(exchange)
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
            response = await self._request(exchange, sent)
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
                    "role": "assistant",
                    # A string, never null: chat templates that join the content as text
                    # (llama.cpp's Python server) fail on null, and an empty string is
                    # what every server takes with tool calls.
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
            for call in calls:
                await trio.lowlevel.checkpoint_if_cancelled()
                result = await run_tool_call(turn, call, f"{turn.new_message_id()}-tool")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.call_id,
                        # A shell tool may print a relay value; it must reach neither the
                        # provider nor its request log.
                        "content": bound_result(turn.tools.redactor.text(result.content)),
                    }
                )
        return answer, StopReason.END_TURN, kept()

    def _window(self, exchange: _Exchange) -> int | None:
        """The model's context window when known (its own setting, else its provider's)."""
        settings = exchange.entry.settings_for(exchange.model)
        if settings is not None and settings.context_window is not None:
            return settings.context_window
        return exchange.entry.context_window

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
        window = self._window(exchange)
        if window is not None:
            request = fit_to_window(request, int(window * (1 - ANSWER_RESERVE_FRACTION)))
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

    async def _request(self, exchange: _Exchange, messages: list[Message]) -> StreamedAnswer:
        async def attempt() -> StreamedAnswer:
            response = StreamedAnswer()
            try:
                await telling_if_slow(
                    exchange.turn,
                    exchange.entry,
                    lambda: response.started,
                    self._stream(exchange, messages, response),
                )
            except ProviderFault as fault:
                if not response.forwarded:
                    raise
                # Part of the answer is already with the caller: a retry would repeat it.
                line = MALFORMED_STREAM if fault.line == MALFORMED_STREAM else BROKEN_STREAM
                raise ProviderFault(line) from None
            return response

        try:
            return await retrying(
                attempt,
                backoff=self._backoff,
                label=f'provider "{exchange.entry.name}": ',
                notify=partial(exchange.turn.notice, "warning", fallback="thought"),
                max_rate_limit_wait=self._config.max_rate_limit_wait,
            )
        except ProviderFault as fault:
            # A fault's line is built here from the provider's address and status only.
            raise TurnFailed(fault.line, loggable=True) from None

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
        entry, model = exchange.entry, exchange.model
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
                model=model,
                messages=(),
                stream=True,
                stream_options={"include_usage": True},
                extra_body=body,
            ) as raw:
                http = raw.http_response
                try:
                    await read_answer(exchange.turn, http.aiter_bytes(), response, compaction_id)
                finally:
                    # On a cancel the provider must see the connection end now, not at
                    # collection; a stream read to its end returns its connection to the pool.
                    with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_BOUND_S):
                        await http.aclose()
        except ProviderFault:
            raise
        except Exception as exc:
            _raise_fault(exc, entry, model)
        if not response.done and response.finish_reason is None:
            # A server that fails after sending its headers ends the body early (even with
            # nothing in it): that is a broken answer, not an empty one.
            raise ProviderFault(BROKEN_STREAM, retryable=True)


async def telling_if_slow(
    turn: Turn, entry: ProviderEntry, started: Callable[[], bool], work: Coroutine[Any, Any, None]
) -> None:
    """Run ``work`` (one streamed request); if ``started()`` is still false (the provider has
    streamed nothing) after :data:`SLOW_ANSWER_NOTICE_S`, tell the user once that the turn is
    waiting on it. Shared by every provider engine.

    Error handling: whatever ``work`` raises propagates as itself, not inside a group."""

    async def tell() -> None:
        await trio.sleep(SLOW_ANSWER_NOTICE_S)
        if not started():
            await turn.notice(
                "info",
                f"waiting for the provider at {where(entry)}: no answer after "
                f"{SLOW_ANSWER_NOTICE_S:.0f} s",
                fallback="thought",
            )

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tell)
            try:
                await work
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        inner = single_exception(group)
        if inner is group:
            raise
        raise inner from None


def _raise_fault(exc: Exception, entry: ProviderEntry, model: str) -> NoReturn:
    fault = sdk_fault(exc, where(entry), model)
    if fault is exc:
        raise exc
    # Not chained: the SDK's exception text may quote the provider's answer.
    raise fault from None


def _goal_progress(answer: str) -> GoalProgress:
    lines = [line.strip().upper() for line in answer.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if "GOAL COMPLETE" in last:
        return GoalProgress(status=GoalStatus.COMPLETE, reason="the model reports the goal met")
    if "GOAL BLOCKED" in last:
        return GoalProgress(status=GoalStatus.BLOCKED, reason="the model needs the user")
    return GoalProgress(reason="more work remains")
