"""The turn loop of the OpenAI-compatible backend: rebuild the conversation, stream one model
request, forward text and reasoning, run the tool calls it asked for, and go again until the
model answers without tools (or a bound or a fault ends the turn)."""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any, NoReturn

import attrs
import openai
import trio

from maple_acp._groups import single_exception
from maple_acp.backends.openai._client import (
    ProviderKeys,
    RequestTimeouts,
    TlsContext,
    open_provider_client,
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
    Message,
    bound_result,
    data_url,
    estimate_tokens,
    fit_to_window,
    history_messages,
    user_message,
    wanted_images,
)
from maple_acp.backends.openai._faults import (
    BACKOFF_S,
    BROKEN_STREAM,
    MALFORMED_STREAM,
    ProviderFault,
    connection_fault,
    retrying,
    status_fault,
)
from maple_acp.backends.openai._native import (
    MAX_ARGUMENT_CHARS,
    ToolCall,
    offered_tools,
    run_tool_call,
)
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
    Usage,
)

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
#: Tool calls kept from one response; more is a broken model, not a plan.
MAX_TOOL_CALLS_PER_RESPONSE = 64

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


@attrs.define
class _ToolDraft:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)
    size: int = 0


@attrs.frozen
class _Exchange:
    """What stays the same across one turn's model requests."""

    turn: Turn
    client: openai.AsyncOpenAI
    entry: ProviderEntry
    #: The model's id at the provider (without the provider's name).
    model: str


@attrs.define
class _Response:
    """One streamed answer as it was assembled."""

    text: list[str] = attrs.field(factory=list)
    tools: dict[int, _ToolDraft] = attrs.field(factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    context_used: int | None = None
    #: Something of this answer already reached the caller: it can no longer be retried.
    forwarded: bool = False
    #: The provider has streamed at least one chunk of it.
    started: bool = False

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


class ProviderBackend:
    """An ``AgentBackend`` over OpenAI-compatible Chat Completions endpoints.

    Resource handling: each turn opens its own HTTP client and closes it (and every stream)
    when the turn ends, is cancelled or fails; a cancelled turn's stream is closed at once, so
    the provider sees its connection end.

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
    ) -> None:
        self._config = config
        self._keys = keys
        self._timeouts = timeouts or RequestTimeouts()
        self._max_requests = max(1, min(max_turn_requests, MAX_TURN_REQUESTS))
        #: Waits before retries 1, 2, 3 when the provider names none.
        self._backoff = tuple(backoff) or BACKOFF_S
        self._tls = TlsContext()

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
        messages = await self._conversation(turn, self.accepts_images(model_id))
        forced = turn.kind is RunKind.PROMPT and turn.prompt.strip() == COMPACT_COMMAND
        async with open_provider_client(
            entry, self._keys.key_for(entry.name), self._timeouts, self._tls
        ) as client:
            exchange = _Exchange(turn, client, entry, model)
            if forced:
                if await self._compact(exchange, messages) is None:
                    await turn.notice("There is nothing to compact yet.")
                return TurnResult()
            answer, stop = await self._loop(exchange, messages)
        if stop is not StopReason.END_TURN:
            logger.info("turn %s stopped: %s", turn.run_id, stop.value)
        progress = _goal_progress(answer) if turn.kind is RunKind.GOAL_CYCLE else None
        return TurnResult(stop_reason=stop, goal_progress=progress)

    async def _conversation(self, turn: Turn, sees: bool) -> list[Message]:
        system = self._config.system_prompt or DEFAULT_SYSTEM_PROMPT.format(root=turn.root)
        if turn.skills:
            listed = "\n".join(f"- {skill.name}: {skill.path}" for skill in turn.skills)
            system += (
                f"\n\nProject skills (read a skill's file when the task matches it):\n{listed}"
            )
        if turn.planning:
            system += f"\n\n{PLANNING_PROMPT}"
        summary, history = after_compaction(turn.history)
        plans = [item.plan for item in turn.history if item.kind is ItemKind.PLAN and item.plan]
        if plans:
            # A plan is not a message a provider accepts back; the model still should know it.
            steps = "\n".join(f"- [{entry.status.value}] {entry.content}" for entry in plans[-1])
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
        return [
            {"role": "system", "content": system},
            *([summary_message(summary)] if summary is not None else []),
            *history_messages(history, urls),
            user_message(prompt, turn.images, urls),
        ]

    async def _loop(self, exchange: _Exchange, messages: list[Message]) -> tuple[str, StopReason]:
        """The model's last answer text and why the turn stops."""
        turn = exchange.turn
        window = self._window(exchange)
        answer = ""
        used = 0
        compacted = False
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
                return answer, StopReason.MAX_TOKENS
            if response.finish_reason == "content_filter":
                return answer, StopReason.REFUSAL
            calls = response.tool_calls(number)
            if not calls:
                return answer, StopReason.END_TURN
            if number == self._max_requests:
                return answer, StopReason.MAX_TURN_REQUESTS
            messages.append(
                {
                    "role": "assistant",
                    "content": answer or None,
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
        return answer, StopReason.END_TURN

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
        response = _Response()
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

    async def _request(self, exchange: _Exchange, messages: list[Message]) -> _Response:
        async def attempt() -> _Response:
            response = _Response()
            try:
                await _telling_if_slow(
                    exchange, response, self._stream(exchange, messages, response)
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
                notify=partial(exchange.turn.notice, "warning"),
                max_rate_limit_wait=self._config.max_rate_limit_wait,
            )
        except ProviderFault as fault:
            # A fault's line is built here from the provider's address and status only.
            raise TurnFailed(fault.line, loggable=True) from None

    async def _stream(
        self,
        exchange: _Exchange,
        messages: list[Message],
        response: _Response,
        *,
        compaction_id: str | None = None,
    ) -> None:
        """One streamed request; with ``compaction_id`` it asks for a summary (no tools), and
        its text is that compaction's, not the agent's."""
        entry, model = exchange.entry, exchange.model
        # Messages and tools are plain dicts built here; the SDK's typed overloads add nothing.
        create: Any = exchange.client.chat.completions.create
        # Read at each request: a mode or effort chosen during the turn applies from the next.
        tools = offered_tools(exchange.turn) if compaction_id is None else []
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        effort = exchange.turn.thought_level
        if effort is not None:
            extra["reasoning_effort"] = effort
        try:
            stream = await create(
                model=model,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                **extra,
            )
        except Exception as exc:
            _raise_fault(exc, entry, model)
        try:
            await _read_stream(exchange.turn, stream, response, compaction_id)
        except ProviderFault:
            raise
        except Exception as exc:
            _raise_fault(exc, entry, model)
        finally:
            # On a cancel the provider must see the connection end now, not at collection.
            with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_BOUND_S):
                await stream.close()


async def _telling_if_slow(
    exchange: _Exchange, response: _Response, work: Coroutine[Any, Any, None]
) -> None:
    """Run ``work`` (one streamed request); if the provider has streamed nothing after
    :data:`SLOW_ANSWER_NOTICE_S`, tell the user once that the turn is waiting on it.

    Error handling: whatever ``work`` raises propagates as itself, not inside a group."""

    async def tell() -> None:
        await trio.sleep(SLOW_ANSWER_NOTICE_S)
        if not response.started:
            await exchange.turn.notice(
                "info",
                f"waiting for the provider at {where(exchange.entry)}: no answer after "
                f"{SLOW_ANSWER_NOTICE_S:.0f} s",
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


async def _read_stream(
    turn: Turn, stream: Any, response: _Response, compaction_id: str | None = None
) -> None:
    text_id: str | None = None
    thought_id: str | None = None
    async for chunk in stream:
        response.started = True
        content, reasoning, fragments, finish, usage = _parts(chunk)
        if usage is not None:
            response.usage, response.context_used = _usage(usage)
        if content and compaction_id is not None:
            response.text.append(content)
            await turn.send_compaction_text(compaction_id, content)
        elif content:
            response.forwarded = True
            response.text.append(content)
            text_id = await turn.send_text(content, message_id=text_id)
        if reasoning:
            response.forwarded = True
            thought_id = await turn.send_thought(reasoning, message_id=thought_id)
        if fragments:
            _add_tool_fragments(response, fragments)
        if finish:
            response.finish_reason = finish


_Parts = tuple[str | None, str | None, Any, str | None, Any]


def _parts(chunk: Any) -> _Parts:
    """Text, reasoning, tool-call fragments, finish reason and usage of one chunk. The SDK
    builds chunks without validating them, so a chunk of the wrong shape surfaces here."""
    try:
        usage = chunk.usage
        choices = chunk.choices
        if not choices:
            return (None, None, None, None, usage)
        choice = choices[0]
        delta = choice.delta
        finish = choice.finish_reason
        if delta is None:
            return (None, None, None, finish, usage)
        content = delta.content
        extra = delta.model_extra
        reasoning = extra.get("reasoning_content") or extra.get("reasoning") if extra else None
        fragments = delta.tool_calls
    except (AttributeError, TypeError, IndexError, KeyError):
        raise ProviderFault(MALFORMED_STREAM) from None
    if (
        (content is not None and not isinstance(content, str))
        or (reasoning is not None and not isinstance(reasoning, str))
        or (finish is not None and not isinstance(finish, str))
    ):
        raise ProviderFault(MALFORMED_STREAM)
    return (content, reasoning, fragments, finish, usage)


def _add_tool_fragments(response: _Response, fragments: Any) -> None:
    try:
        _add_fragments(response, fragments)
    except (AttributeError, TypeError):
        raise ProviderFault(MALFORMED_STREAM) from None


def _add_fragments(response: _Response, fragments: Any) -> None:
    for fragment in fragments:
        index = fragment.index if isinstance(fragment.index, int) else len(response.tools)
        draft = response.tools.get(index)
        if draft is None:
            if len(response.tools) >= MAX_TOOL_CALLS_PER_RESPONSE:
                raise ProviderFault(MALFORMED_STREAM)
            draft = response.tools[index] = _ToolDraft()
        if fragment.id and not draft.call_id:
            draft.call_id = str(fragment.id)
        function = fragment.function
        if function is None:
            continue
        if function.name and not draft.name:
            draft.name = str(function.name)
        arguments = function.arguments
        if arguments:
            draft.size += len(arguments)
            if draft.size <= MAX_ARGUMENT_CHARS:
                draft.arguments.append(str(arguments))


def _usage(usage: Any) -> tuple[Usage, int]:
    prompt = _int(getattr(usage, "prompt_tokens", 0))
    completion = _int(getattr(usage, "completion_tokens", 0))
    total = _int(getattr(usage, "total_tokens", 0)) or prompt + completion
    details = getattr(usage, "prompt_tokens_details", None)
    cached = _int(getattr(details, "cached_tokens", 0)) if details is not None else 0
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
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _raise_fault(exc: Exception, entry: ProviderEntry, model: str) -> NoReturn:
    fault = _fault(exc, entry, model)
    if fault is exc:
        raise exc
    # Not chained: the SDK's exception text may quote the provider's answer.
    raise fault from None


def _fault(exc: Exception, entry: ProviderEntry, model: str) -> Exception:
    """The ``ProviderFault`` an SDK or transport error means; anything else (a bug) as it
    was."""
    inner = single_exception(exc)
    if isinstance(inner, openai.APIStatusError):
        body: object = inner.body
        return status_fault(inner.status_code, inner.response.headers, body, model)
    if isinstance(inner, openai.APITimeoutError):
        return connection_fault(where(entry), timed_out=True)
    if isinstance(inner, openai.APIConnectionError):
        if _caused_by(inner, ssl.SSLError):
            # Retrying cannot make an untrusted certificate trusted.
            return ProviderFault(
                f"the provider at {where(entry)} has a TLS certificate not trusted here"
            )
        return connection_fault(where(entry), timed_out=False)
    if isinstance(
        inner, (json.JSONDecodeError, UnicodeDecodeError, openai.APIResponseValidationError)
    ):
        return ProviderFault(MALFORMED_STREAM)
    if isinstance(inner, openai.APIError):
        # An error event inside the stream; its text is the provider's, so not shown.
        return ProviderFault("the provider reported an error inside its stream")
    return exc


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            return any(_caused_by(member, kind) for member in current.exceptions)
        current = current.__cause__ or current.__context__
    return False


def _goal_progress(answer: str) -> GoalProgress:
    lines = [line.strip().upper() for line in answer.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if "GOAL COMPLETE" in last:
        return GoalProgress(status=GoalStatus.COMPLETE, reason="the model reports the goal met")
    if "GOAL BLOCKED" in last:
        return GoalProgress(status=GoalStatus.BLOCKED, reason="the model needs the user")
    return GoalProgress(reason="more work remains")
