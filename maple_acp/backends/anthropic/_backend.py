"""The turn loop of the Anthropic Messages backend: rebuild the conversation, stream one
Messages request, forward text and thinking, run the tool calls it asked for (the same tools,
modes and permission rules as the OpenAI-compatible backend), and go again until the model
stops for another reason than ``tool_use`` (or a bound or a fault ends the turn).

Thinking blocks arrive with a signature; the turn keeps each block exactly as streamed in the
messages it sends back, because a request continuing a tool loop must carry the thinking that
led to the tool call, signature intact. Usage carries the cache-read and cache-write tokens;
with configured prices the session's cumulative cost goes out with the context usage."""

from __future__ import annotations

import collections
import json
import logging
import ssl
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import trio

from maple_acp._groups import single_exception
from maple_acp.backends.anthropic._client import MessagesClients, import_sdk
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
from maple_acp.backends.openai._backend import telling_if_slow
from maple_acp.backends.openai._client import ProviderKeys, RequestTimeouts, where
from maple_acp.backends.openai._compaction import SUMMARY_PREFIX, after_compaction
from maple_acp.backends.openai._config import (
    ANTHROPIC_KIND,
    ModelPrices,
    ModelSettings,
    ProviderConfig,
    ProviderEntry,
    split_model_id,
)
from maple_acp.backends.openai._conversation import (
    bound_result,
    encode_transcript,
    kept_transcripts,
    wanted_images,
)
from maple_acp.backends.openai._faults import (
    BACKOFF_S,
    BROKEN_STREAM,
    MALFORMED_STREAM,
    OVERLOADED_CODES,
    ProviderFault,
    connection_fault,
    retrying,
    status_fault,
)
from maple_acp.backends.openai._native import (
    offered_tools,
    run_tool_call,
)
from maple_acp.model import ItemKind
from maple_acp.runtime import (
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
    import anthropic

logger = logging.getLogger(__name__)

#: Model requests in one turn; the next one would end the turn as ``max_turn_requests``.
MAX_TURN_REQUESTS = 64
#: Closing a stream's connection after a cancel or a fault: shielded, but never for long.
STREAM_CLOSE_BOUND_S = 1.0
#: The answer's token bound (the Messages API requires one); thinking comes on top.
MAX_ANSWER_TOKENS = 8192
#: Thinking budget (tokens) of each thinking level a model marked ``reasoning = true`` offers.
THINKING_BUDGETS: Mapping[str, int] = {"low": 2048, "medium": 8192, "high": 24576}
#: Sessions whose running cost is remembered (the oldest is forgotten past this).
MAX_COSTED_SESSIONS = 4096

DEFAULT_SYSTEM_PROMPT = (
    "You are a coding assistant working in the project directory {root}. Use the tools to "
    "read files, change them and run commands there; give paths relative to that directory. "
    "Be brief, and say what you changed."
)
PLANNING_PROMPT = (
    "The session is in plan mode: do not change anything. Read what you need, then work out "
    "a plan with update_plan and explain it; the user switches modes to carry it out."
)
GOAL_PROMPT = (
    "Keep working toward this goal: {objective}\n"
    "End your answer with one line: GOAL COMPLETE when it is achieved, GOAL BLOCKED when you "
    "cannot go on without the user, or GOAL CONTINUE when more work remains."
)


@attrs.frozen
class _Exchange:
    """What stays the same across one turn's model requests."""

    turn: Turn
    client: anthropic.AsyncAnthropic
    entry: ProviderEntry
    #: The model's id at the provider (without the provider's name).
    model: str
    system: str


class AnthropicBackend:
    """An ``AgentBackend`` over Anthropic Messages endpoints (``kind = "anthropic"``).

    Resource handling: one SDK client per provider for the backend's life; use the backend as
    ``async with backend:`` (or ``await backend.aclose()``) so that they close, explicitly (the
    SDK's own clean-up runs only under asyncio). Every stream is closed when its request ends,
    is cancelled or fails; a cancelled turn's stream at once, so the provider sees its
    connection end.

    Error handling: as the OpenAI-compatible backend (``openai._faults``): 401/403, an unknown
    model, 429 and 529 ("overloaded", also as an error event before anything was forwarded)
    with the same retry and rate-limit waits, a malformed or broken stream; each ends the turn
    with ``TurnFailed`` and one safe line, never the provider's text or the key.

    Cancellation: waits are Trio sleeps in the run's scope; a cancel ends them, and the stream,
    at once; no tool runs after it.
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
        self._backoff = tuple(backoff) or BACKOFF_S
        self._clients = MessagesClients(keys, self._timeouts)
        #: Each session's cost so far in USD (only for models with configured prices).
        self._costs: collections.OrderedDict[str, float] = collections.OrderedDict()

    async def warm_up(self) -> None:
        """Import the SDK in a worker thread, ahead of the first turn (a host starts this once
        it serves). Never raises: a turn meets the same failure and says it."""
        try:
            await trio.to_thread.run_sync(import_sdk)
            for entry in self._config.providers:
                if entry.kind == ANTHROPIC_KIND:
                    self._clients.get(entry)
        except Exception as exc:
            logger.warning("could not prepare the anthropic clients ahead (%s)", type(exc).__name__)

    async def aclose(self) -> None:
        """Close every provider's client and its connections."""
        await self._clients.aclose()

    async def __aenter__(self) -> AnthropicBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        """Embedded text resources always; images when an Anthropic provider's model is marked
        ``vision = true`` (``accepts_images`` then says which)."""
        sees = any(
            settings.vision
            for entry in self._config.providers
            if entry.kind == ANTHROPIC_KIND
            for settings in entry.model_settings
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
        """The thinking levels (``THINKING_BUDGETS``) of a model marked ``reasoning = true``."""
        settings = self._settings(model_id)
        return tuple(THINKING_BUDGETS) if settings is not None and settings.reasoning else ()

    async def run_turn(self, turn: Turn) -> TurnResult:
        model_id = turn.model or self._config.default_model
        try:
            provider_name, model = split_model_id(model_id)
        except ValueError:
            raise TurnFailed(f"the model id {model_id[:200]!r} is not provider/model") from None
        entry = self._config.provider(provider_name)
        if entry is None:
            raise TurnFailed(f"the model {model_id[:200]!r} is no longer configured")
        system, messages, mark = await self._conversation(turn, self.accepts_images(model_id))
        exchange = _Exchange(turn, self._clients.get(entry), entry, model, system)
        answer, stop, final = await self._loop(exchange, messages)
        # Later turns send this run's part again as it went, byte for byte: the model sees
        # the same results and thinking, and the prompt cache still matches.
        sent = since(messages, mark)
        if final:
            sent.append({"role": "assistant", "content": final})
        await turn.keep_transcript(encode_transcript(TRANSCRIPT_FORMAT, sent))
        if stop is not StopReason.END_TURN:
            logger.info("turn %s stopped: %s", turn.run_id, stop.value)
        progress = _goal_progress(answer) if turn.kind is RunKind.GOAL_CYCLE else None
        return TurnResult(stop_reason=stop, goal_progress=progress)

    async def _conversation(self, turn: Turn, sees: bool) -> tuple[str, list[Message], Mark]:
        """The system prompt and messages of the turn's first request, and where this run's
        part of them starts (after its user message): what a transcript of the run keeps."""
        system = self._config.system_prompt or DEFAULT_SYSTEM_PROMPT.format(root=turn.root)
        if turn.skills:
            listed = "\n".join(f"- {skill.name}: {skill.path}" for skill in turn.skills)
            system += (
                f"\n\nProject skills (read a skill's file when the task matches it):\n{listed}"
            )
        if turn.planning:
            system += f"\n\n{PLANNING_PROMPT}"
        summary, history = after_compaction(turn.history)
        transcripts = await kept_transcripts(turn, history, TRANSCRIPT_FORMAT)
        plans = [item for item in turn.history if item.kind is ItemKind.PLAN and item.plan]
        if plans and plans[-1].run_id not in transcripts:
            steps = "\n".join(f"- [{e.status.value}] {e.content}" for e in plans[-1].plan)
            system += f"\n\nYour plan so far (update it with update_plan):\n{steps}"
        prompt = turn.prompt
        if turn.kind is RunKind.GOAL_CYCLE:
            prompt = GOAL_PROMPT.format(objective=turn.prompt)
        # Images go as base64 blocks, read once per turn (none for a model that does not see).
        sources: dict[str, Block] = {}
        for image in wanted_images(history, turn.images) if sees else ():
            data = await turn.image_data(image)
            if data is not None:
                sources[image.sha256] = image_source(image, data)
        messages: list[Message] = []
        if summary is not None:
            # Compacted by the OpenAI-compatible backend: the summary stands for what it covers.
            user_text(messages, SUMMARY_PREFIX + summary)
        mark = replay_history(history, messages, sources, transcripts, turn.run_id)
        user_text(messages, prompt, turn.images, sources)
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
            response = await self._request(exchange, messages)
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
            results: list[Block] = []
            for call in calls:
                await trio.lowlevel.checkpoint_if_cancelled()
                result = await run_tool_call(turn, call, f"{turn.new_message_id()}-tool")
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": call.call_id,
                        # A shell tool may print a relay value; it must not reach the provider.
                        "content": bound_result(turn.tools.redactor.text(result.content)),
                    }
                )
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
            raise TurnFailed(fault.line) from None

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
                try:
                    await read_stream(turn, http.aiter_bytes(), response)
                finally:
                    # On a cancel the provider must see the connection end now.
                    with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_BOUND_S):
                        await http.aclose()
        except ProviderFault:
            raise
        except Exception as exc:
            _raise_fault(exc, exchange.entry, exchange.model)
        if not response.complete:
            raise ProviderFault(BROKEN_STREAM, retryable=True)


def _raise_fault(exc: Exception, entry: ProviderEntry, model: str) -> NoReturn:
    fault = _fault(exc, entry, model)
    if fault is exc:
        raise exc
    # Not chained: the SDK's exception text may quote the provider's answer.
    raise fault from None


def _fault(exc: Exception, entry: ProviderEntry, model: str) -> Exception:
    """The ``ProviderFault`` an SDK or transport error means; anything else (a bug) as it
    was."""
    import anthropic

    inner = single_exception(exc)
    if isinstance(inner, anthropic.APIStatusError):
        if inner.status_code < 400:
            # An error event inside a stream that began well.
            if _error_type(inner.body) in OVERLOADED_CODES:
                return ProviderFault(
                    "the provider is overloaded (an error event in its stream)",
                    retryable=True,
                    rate_limited=True,
                )
            return ProviderFault("the provider reported an error inside its stream")
        return status_fault(inner.status_code, inner.response.headers, inner.body, model)
    if isinstance(inner, anthropic.APITimeoutError):
        return connection_fault(where(entry), timed_out=True)
    if isinstance(inner, anthropic.APIConnectionError):
        if _caused_by(inner, ssl.SSLError):
            return ProviderFault(
                f"the provider at {where(entry)} has a TLS certificate not trusted here"
            )
        return connection_fault(where(entry), timed_out=False)
    if isinstance(
        inner, (json.JSONDecodeError, UnicodeDecodeError, anthropic.APIResponseValidationError)
    ):
        return ProviderFault(MALFORMED_STREAM)
    if isinstance(inner, anthropic.APIError):
        return ProviderFault("the provider reported an error inside its stream")
    return exc


def _error_type(body: object) -> str | None:
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("type"), str):
            return str(inner["type"])
    return None


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
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
