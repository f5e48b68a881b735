"""The turn shell every engine runs: which provider and model a turn goes to, the system
prompt, the goal cycle's prompt and verdict, the rounds of a turn (steering, one streamed
request retried within the fault rules, a notice when the provider keeps the turn waiting,
the tool calls), and how the turn ends.

An engine subclasses :class:`ProviderEngine` and supplies what is its own: its clients, and
an :class:`Exchange` per turn (the shape of its messages, its request, the reading of its
stream and of its stop reasons; see CONTRIBUTING.md, "Adding an engine"). An exchange that
is also a ``Compacting`` gets compaction (``_compaction.py``): the shell compacts before a
request that would fill most of a known window, and on ``/compact``."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from functools import partial
from typing import Any, ClassVar, NoReturn, Protocol, Self, TypeVar, runtime_checkable

import trio

from maple_acp._groups import single_exception
from maple_acp.backends.provider._compaction import (
    COMPACT_INFO,
    NOTHING_TO_COMPACT,
    Compacting,
    compact,
    compact_if_full,
)
from maple_acp.backends.provider._config import (
    ModelSettings,
    ProviderConfig,
    ProviderEntry,
    split_model_id,
)
from maple_acp.backends.provider._faults import (
    BACKOFF_S,
    BROKEN_STREAM,
    MALFORMED_STREAM,
    ProviderFault,
    beyond_window,
    retrying,
)
from maple_acp.backends.provider._history import (
    COMPACT_COMMAND,
    bound_result,
    encode_transcript,
    wanted_images,
)
from maple_acp.backends.provider._http import ProviderKeys, RequestTimeouts, where
from maple_acp.backends.provider._tools import DELEGATE, ToolCall, run_tool_call
from maple_acp.model import ImageRef, ItemKind, TimelineItem
from maple_acp.runtime import (
    Backend,
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

logger = logging.getLogger(__name__)

#: Model requests in one turn; the next one would end the turn as ``max_turn_requests``.
MAX_TURN_REQUESTS = 64
#: Closing a stream's connection after a cancel or a fault: shielded, but never for long.
STREAM_CLOSE_BOUND_S = 1.0
#: A request with nothing streamed back after this long gets a notice: without one the user
#: sees only silence while a cold local model loads or a busy provider queues the request.
SLOW_ANSWER_NOTICE_S = 5.0

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


class Clients(Protocol):
    """An engine's SDK clients, one per provider for the engine's life."""

    async def aclose(self) -> None: ...


class Streamed(Protocol):
    """What the shell reads of an answer being streamed."""

    #: The provider has streamed some of it.
    started: bool
    #: Some of it reached the user: it can no longer be retried.
    forwarded: bool


AnswerT = TypeVar("AnswerT", bound=Streamed)
MediaT = TypeVar("MediaT")
#: One request: it streams an answer into the value it is given.
Request = Callable[[AnswerT], Coroutine[Any, Any, None]]


class Exchange(Protocol[AnswerT]):
    """One turn's conversation as an engine holds it between its requests: its messages in
    the engine's own format, its request, and what it reads of each answer. The shell runs
    the rounds (:meth:`ProviderEngine.converse`)."""

    def fresh(self) -> AnswerT:
        """An empty answer for one attempt of a request to stream into."""
        ...

    def steer(self, items: Sequence[TimelineItem]) -> None:
        """Add what the user sent while the turn worked, before the next request."""
        ...

    async def request(self) -> Request[AnswerT]:
        """The next request, retried as it is (a compaction or a trim comes before it)."""
        ...

    async def outcome(self, answer: AnswerT, number: int) -> StopReason | list[ToolCall]:
        """What the turn's ``number``th answer means, once its usage is reported: why the
        turn stops, or the calls to run before the next request (none: go on)."""
        ...

    def add(self, answer: AnswerT, told: Sequence[tuple[ToolCall, str]]) -> None:
        """Add the answer and its calls, and what the model is told of each."""
        ...

    def text(self, answer: AnswerT) -> str:
        """The answer's text (a goal cycle's verdict is read from it)."""
        ...

    def transcript(self, answer: AnswerT) -> Sequence[Any] | None:
        """What this run sent after its user message, the last answer included, for
        :meth:`ProviderEngine.keep`; ``None`` when it is not to be kept."""
        ...


@runtime_checkable
class Measured(Protocol):
    """What an exchange adds so that a request too long for its model's window fails with
    one line naming both sizes, and is not sent again."""

    #: The model's context window when known.
    window: int | None

    def request_estimate(self) -> int:
        """The estimated tokens of the request :meth:`Exchange.request` built last (after any
        trim): its system prompt and messages."""
        ...


class ProviderEngine(Backend):
    """The shell of an ``AgentBackend`` over one kind of provider (``kind``): the turn's
    target, the model settings it reads, the system prompt, the retried request, the end of
    the turn, and the rounds between (``run_turn``, ``converse``). Subclasses give their
    clients (``open_clients``) and each turn's :class:`Exchange` (``exchange``).

    Error handling: a provider fault ends the turn with ``TurnFailed`` and one safe line
    (never the key or the provider's own text). Rate limits, server errors and lost
    connections before any of the answer was forwarded are retried; a rate limit resetting
    past the retry bound is waited out up to the configuration's ``max_rate_limit_wait``.

    Cancellation: every wait is a Trio sleep in the run's scope; a cancel ends it at once."""

    #: The provider kind this engine serves (``[[providers]] kind``).
    kind: ClassVar[str]
    #: The thinking levels a model marked ``reasoning = true`` offers.
    levels: ClassVar[tuple[str, ...]] = ()
    #: The format of this engine's transcripts (``keep``).
    transcript_format: ClassVar[str]
    #: Its exchanges are ``Compacting``: the engine offers ``/compact``.
    compacts: ClassVar[bool] = False

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
        self._clients = self.open_clients()

    async def exchange(self, turn: Turn, entry: ProviderEntry, model: str) -> Exchange[Any]:
        """The turn's conversation with ``model`` at ``entry``, up to its first request."""
        raise NotImplementedError

    def available_commands(self) -> tuple[CommandInfo, ...]:
        """``/compact`` when this engine compacts."""
        return (COMPACT_INFO,) if self.compacts else ()

    async def run_turn(self, turn: Turn) -> TurnResult:
        """The turn's rounds with its model; what it sent is kept for later turns (not after
        a compaction). ``/compact`` compacts the conversation and asks the model nothing else."""
        entry, model = self.target(turn)
        exchange = await self.exchange(turn, entry, model)
        compacting = exchange if isinstance(exchange, Compacting) else None
        command = turn.kind is RunKind.PROMPT and turn.prompt.strip() == COMPACT_COMMAND
        if compacting is not None and command:
            if await compact(turn, compacting) is None:
                await turn.notice(NOTHING_TO_COMPACT)
            return TurnResult()
        answer, stop = await self.converse(turn, entry, exchange)
        if compacting is None or not compacting.compacted:
            sent = exchange.transcript(answer)
            if sent is not None:
                await self.keep(turn, self.transcript_format, sent)
        return self.ended(turn, exchange.text(answer), stop)

    async def converse(
        self, turn: Turn, entry: ProviderEntry, exchange: Exchange[AnswerT]
    ) -> tuple[AnswerT, StopReason]:
        """The rounds of a turn: what the user added meanwhile, one retried request, its
        tool calls; until an answer stops the turn or the request bound does. The last
        answer, and why the turn stops. A ``Compacting`` exchange is compacted before a
        request that would fill most of its window (once a turn)."""
        compacting = exchange if isinstance(exchange, Compacting) else None
        measured = exchange if isinstance(exchange, Measured) else None
        for number in itertools.count(1):
            exchange.steer(turn.steering())
            if compacting is not None:
                await compact_if_full(turn, compacting)
            request = await exchange.request()
            size: tuple[int | None, int | None] = (None, None)
            if measured is not None:
                size = (measured.request_estimate(), measured.window)
            answer = await self.retried(turn, entry, exchange.fresh, request, size=size)
            outcome = await exchange.outcome(answer, number)
            if isinstance(outcome, StopReason):
                return answer, outcome
            if number >= self._max_requests:
                return answer, StopReason.MAX_TURN_REQUESTS
            exchange.add(answer, await self.run_tools(turn, outcome))
        raise AssertionError("unreachable")

    def open_clients(self) -> Clients:
        """The engine's clients (made here, each opened on first use or by ``prepare``)."""
        raise NotImplementedError

    async def prepare(self) -> None:
        """Import the engine's SDK (in a worker thread) and make its clients."""

    async def warm_up(self) -> None:
        """``prepare`` ahead of the first turn (a host starts this once it serves). Never
        raises: a turn meets the same failure and says it."""
        try:
            await self.prepare()
        except Exception as exc:
            logger.warning(
                "could not prepare the %s clients ahead (%s)", self.kind, type(exc).__name__
            )

    async def aclose(self) -> None:
        """Close every provider's client and its connections."""
        await self._clients.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        """Embedded text resources always; images when a model of this engine's providers is
        marked ``vision = true`` (``accepts_images`` then says which)."""
        sees = any(
            settings.vision for entry in self._entries() for settings in entry.model_settings
        )
        return PromptCapabilities(image=sees, embedded_context=True)

    def _entries(self) -> list[ProviderEntry]:
        return [entry for entry in self._config.providers if entry.kind == self.kind]

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
        """This engine's thinking levels for a model marked ``reasoning = true``, else none."""
        settings = self._settings(model_id)
        return self.levels if settings is not None and settings.reasoning else ()

    def target(self, turn: Turn) -> tuple[ProviderEntry, str]:
        """The turn's provider and its model's id there; ``TurnFailed`` when the model is not
        (or no longer) configured."""
        model_id = turn.model or self._config.default_model
        try:
            provider_name, model = split_model_id(model_id)
        except ValueError:
            raise TurnFailed(f"the model id {model_id[:200]!r} is not provider/model") from None
        entry = self._config.provider(provider_name)
        if entry is None:
            raise TurnFailed(f"the model {model_id[:200]!r} is no longer configured")
        return entry, model

    def window(self, entry: ProviderEntry, model: str) -> int | None:
        """The model's context window when known (its own setting, else its provider's)."""
        settings = entry.settings_for(model)
        if settings is not None and settings.context_window is not None:
            return settings.context_window
        return entry.context_window

    def system_prompt(
        self, turn: Turn, history: Sequence[TimelineItem], sent: Collection[str]
    ) -> str:
        """The configured (or default) system prompt, with the project's skills, plan mode,
        and the latest plan unless the run that made it is sent as it went (``sent``: the
        runs whose transcript a request carries, its ``update_plan`` call included)."""
        system = self._config.system_prompt or DEFAULT_SYSTEM_PROMPT.format(root=turn.root)
        if turn.skills:
            listed = "\n".join(f"- {skill.name}: {skill.path}" for skill in turn.skills)
            system += (
                f"\n\nProject skills (read a skill's file when the task matches it):\n{listed}"
            )
        if turn.planning:
            system += f"\n\n{PLANNING_PROMPT}"
        plans = [item for item in history if item.kind is ItemKind.PLAN]
        # The latest plan only: a cleared one (no entries, no Markdown) is no plan at all.
        if plans and (plans[-1].plan or plans[-1].text) and plans[-1].run_id not in sent:
            # A plan is not a message a provider accepts back; the model still should know it.
            steps = plans[-1].text or "\n".join(
                f"- [{e.status.value}] {e.content}" for e in plans[-1].plan
            )
            system += f"\n\nYour plan so far (update it with update_plan):\n{steps}"
        return system

    async def images(
        self,
        turn: Turn,
        history: Sequence[TimelineItem],
        encode: Callable[[ImageRef, bytes], MediaT],
    ) -> dict[str, MediaT]:
        """The images a request carries (this turn's and the history's latest), read once per
        turn and ``encode``d, by SHA-256; none for a model not marked ``vision``."""
        found: dict[str, MediaT] = {}
        if not self.accepts_images(turn.model):
            return found
        for image in wanted_images(history, turn.images):
            data = await turn.image_data(image)
            if data is not None:
                found[image.sha256] = encode(image, data)
        return found

    @staticmethod
    async def run_tools(turn: Turn, calls: Sequence[ToolCall]) -> list[tuple[ToolCall, str]]:
        """Run each call as its tool row, in order; what the model is told of each (bounded,
        without relay values: a shell tool may print one, and it must reach neither the
        provider nor its request log). No tool runs after a cancel. The ``delegate`` calls run
        together, each in a task of this turn's (the runtime lets four run at once); their
        results keep the calls' order."""
        results: dict[int, str] = {}

        async def run(index: int, call: ToolCall, row_id: str) -> None:
            result = await run_tool_call(turn, call, row_id)
            results[index] = bound_result(turn.tools.redactor.text(result.content))

        async with trio.open_nursery() as children:
            for index, call in enumerate(calls):
                await trio.lowlevel.checkpoint_if_cancelled()
                row_id = f"{turn.new_message_id()}-tool"
                if call.name == DELEGATE and turn.can_delegate:
                    children.start_soon(run, index, call, row_id)
                else:
                    await run(index, call, row_id)
        return [(call, results[index]) for index, call in enumerate(calls)]

    @staticmethod
    async def keep(turn: Turn, kind: str, messages: Sequence[Any]) -> None:
        """Keep what this run sent (its messages after its user message) for later turns,
        which send it again byte for byte: the model sees the same results, and the
        provider's prompt cache still matches."""
        await turn.keep_transcript(encode_transcript(kind, messages))

    @staticmethod
    def prompt_text(turn: Turn) -> str:
        """The user's words, or a goal cycle's instruction."""
        if turn.kind is RunKind.GOAL_CYCLE:
            return GOAL_PROMPT.format(objective=turn.prompt)
        return turn.prompt

    @staticmethod
    def ended(turn: Turn, answer: str, stop: StopReason) -> TurnResult:
        """The turn's result: why it stopped, and a goal cycle's verdict."""
        if stop is not StopReason.END_TURN:
            logger.info("turn %s stopped: %s", turn.run_id, stop.value)
        progress = goal_progress(answer) if turn.kind is RunKind.GOAL_CYCLE else None
        return TurnResult(stop_reason=stop, goal_progress=progress)

    async def retried(
        self,
        turn: Turn,
        entry: ProviderEntry,
        answer: Callable[[], AnswerT],
        stream: Request[AnswerT],
        *,
        loggable: bool = True,
        size: tuple[int | None, int | None] = (None, None),
    ) -> AnswerT:
        """One streamed answer (``stream`` fills the fresh ``answer()``), retried within the
        fault rules while none of it was forwarded; ``TurnFailed`` with one line when it
        fails. ``size`` is the request's estimated tokens and the model's window, when known:
        a request that does not fit fails naming both, without a retry."""

        async def attempt() -> AnswerT:
            response = answer()
            try:
                await telling_if_slow(turn, entry, lambda: response.started, stream(response))
            except ProviderFault as fault:
                if not response.forwarded:
                    judged = beyond_window(fault, *size)
                    if judged is fault:
                        raise
                    raise judged from None
                # Part of the answer is already with the caller: a retry would repeat it.
                line = MALFORMED_STREAM if fault.line == MALFORMED_STREAM else BROKEN_STREAM
                raise ProviderFault(line) from None
            return response

        try:
            return await retrying(
                attempt,
                backoff=self._backoff,
                label=f'provider "{entry.name}": ',
                notify=partial(turn.notice, "warning", fallback="thought"),
                max_rate_limit_wait=self._config.max_rate_limit_wait,
            )
        except ProviderFault as fault:
            # A fault's line is built from the provider's address and status only.
            raise TurnFailed(fault.line, loggable=loggable) from None


async def closing(response: Any, read: Awaitable[None]) -> None:
    """Read a streamed response (``read``), then close it at once whatever happened: on a
    cancel the provider must see the connection end now, not at collection; a stream read to
    its end returns its connection to the pool."""
    try:
        await read
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_BOUND_S):
            await response.aclose()


def raise_fault(fault: Exception, exc: Exception) -> NoReturn:
    """Raise ``fault`` (what an SDK or transport error ``exc`` means), or ``exc`` itself
    when it means nothing known (a bug). Not chained: the SDK's text may quote the provider."""
    if fault is exc:
        raise exc
    raise fault from None


async def telling_if_slow(
    turn: Turn, entry: ProviderEntry, started: Callable[[], bool], work: Coroutine[Any, Any, None]
) -> None:
    """Run ``work`` (one streamed request); if ``started()`` is still false (the provider has
    streamed nothing) after :data:`SLOW_ANSWER_NOTICE_S`, tell the user once that the turn is
    waiting on it.

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


def goal_progress(answer: str) -> GoalProgress:
    """A goal cycle's verdict from the last line of the model's answer."""
    lines = [line.strip().upper() for line in answer.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if "GOAL COMPLETE" in last:
        return GoalProgress(status=GoalStatus.COMPLETE, reason="the model reports the goal met")
    if "GOAL BLOCKED" in last:
        return GoalProgress(status=GoalStatus.BLOCKED, reason="the model needs the user")
    return GoalProgress(reason="more work remains")
