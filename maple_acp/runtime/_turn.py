"""``Turn``: everything a backend receives for one run and every way it reports back."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol

import attrs

from maple_acp.model import (
    CommandInfo,
    GoalRecord,
    ImageRef,
    ItemKind,
    PlanEntry,
    SessionMode,
    TimelineItem,
    ToolCategory,
    ToolSpec,
    ToolState,
    ToolStatus,
    Usage,
)
from maple_acp.runtime._attachments import Prompt
from maple_acp.runtime._errors import bounded_text
from maple_acp.runtime._events import (
    NOTICE_LEVELS,
    ContextUsage,
    NoticeFallback,
    NoticeLevel,
    RunKind,
    RunNotice,
    RunState,
    StopReason,
    TitleChanged,
    ToolOutput,
)
from maple_acp.runtime._live_output import ShellOutput
from maple_acp.runtime._modes import tool_category
from maple_acp.runtime._offer import bounded_commands, bounded_markdown_plan, bounded_plan
from maple_acp.runtime._outlet import RunOutlet
from maple_acp.runtime._permissions import ToolRequest
from maple_acp.runtime._tools import BackgroundShells, ShellResult, ToolContext, ToolUnavailable
from maple_acp.runtime._trust import SkillInfo

logger = logging.getLogger(__name__)

#: A title a backend sets is one line of at most this many characters.
MAX_TITLE_CHARS = 200
#: A transcript a backend keeps for one run, at most (a run of many tool calls with long
#: outputs stays well below it).
MAX_TRANSCRIPT_BYTES = 16 * 1024 * 1024
#: Where each notice level lands in the log.
_LOG_LEVELS: Final[dict[NoticeLevel, int]] = {
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


@attrs.frozen(kw_only=True)
class DelegationResult:
    """How a delegation to a child session ended (``Turn.delegate``)."""

    #: The child session's task id.
    child_id: str
    #: ``COMPLETED``, ``FAILED`` or ``CANCELLED`` (the child alone, or its parent's turn).
    state: RunState
    #: What the parent's model is told: the child's final answer (at most 16,000
    #: characters), or one line saying why there is none.
    text: str
    #: For a completed child: why its turn stopped.
    stop_reason: StopReason = StopReason.END_TURN


class Delegator(Protocol):
    """Runs a turn's delegations (the runtime's ``_children``; a child's turn has none)."""

    async def delegate(
        self, turn: Turn, outlet: RunOutlet, tool_id: str, title: str, prompt: str
    ) -> DelegationResult: ...


class Turn:
    """The backend's view of one run: what to do, and where to report it. How the turn ended
    is not reported here: ``run_turn`` returns it as a ``TurnResult``.

    Every ``send_*``/report method is ordered with the others. The awaited ones wait for room
    in the run's event queue (this is how a slow consumer slows the backend); the one ``*_nowait``
    method is for producers that cannot wait, and cancels the run if the queue is full.
    """

    def __init__(
        self,
        outlet: RunOutlet,
        *,
        task_id: str,
        kind: RunKind,
        prompt: Prompt,
        model: str | None,
        root: str,
        skills: tuple[SkillInfo, ...],
        goal: GoalRecord | None,
        tools: ToolContext,
        history: tuple[TimelineItem, ...] = (),
        offered_tools: tuple[ToolSpec, ...] = (),
        read_blob: Callable[[str], Awaitable[bytes | None]] | None = None,
        delegator: Delegator | None = None,
    ) -> None:
        self._outlet = outlet
        self._delegator = delegator
        #: This turn is a child session's (a parent's ``delegate`` started it).
        self.delegated = False
        self.run_id = outlet.run_id
        self.task_id = task_id
        self.kind = kind
        #: The prompt text (joined by the caller), or the goal objective for a goal cycle.
        self.prompt = prompt.text
        self.model = model
        #: The task's canonical project directory.
        self.root = root
        #: Project skills visible to the model: empty unless the project is trusted.
        self.skills = skills
        #: The task's goal when the turn started.
        self.goal = goal
        self.tools = tools
        # A lease runs one turn at a time: its tools' notices (a dropped MCP server) go here.
        tools.notify_through(self.notice)
        #: The task's visible history before this turn's user message, in order (user,
        #: assistant, thought, tool rows with their final state, plans), read once per turn.
        self.history = history
        self._offered_tools = offered_tools
        #: The prompt's images, in order (their bytes: ``image_data``). The prompt text
        #: already holds the embedded ``resources``, each as its ``rendered`` text.
        self.images = prompt.image_refs
        self.resources = prompt.resources
        self._image_bytes = prompt.image_bytes
        self._read_blob = read_blob

    async def image_data(self, image: ImageRef) -> bytes | None:
        """The bytes of an image of this prompt or of the history (``None``: no longer
        stored)."""
        data = self._image_bytes.get(image.sha256)
        if data is None and self._read_blob is not None:
            data = await self._read_blob(image.sha256)
        return data

    def follow_up(self, prompt: Prompt, history: tuple[TimelineItem, ...]) -> Turn:
        """The same run's next backend turn, for steering messages this one did not take
        (the runtime makes it; a backend does not need to)."""
        turn = Turn(
            self._outlet,
            task_id=self.task_id,
            kind=self.kind,
            prompt=prompt,
            model=self.model,
            root=self.root,
            skills=self.skills,
            goal=self.goal,
            tools=self.tools,
            history=history,
            offered_tools=self._offered_tools,
            # The history's images (the first prompt's among them) stay readable.
            read_blob=self._read_blob,
            delegator=self._delegator,
        )
        turn.delegated = self.delegated
        return turn

    # -- child sessions ------------------------------------------------------------------------

    @property
    def can_delegate(self) -> bool:
        """Whether this turn may start child sessions (a child's own turn may not: depth 1)."""
        return self._delegator is not None

    async def delegate(self, tool_id: str, title: str, prompt: str) -> DelegationResult:
        """Start a child session for ``prompt`` and wait for its answer. The child is a task
        of its own under this one, in the session's directories and mode, with the session's
        model (or the host's subagent model) and a history of ``prompt`` only; its turn runs
        inside this run (cancelling this run cancels it). At most 4 run at once per turn (a
        further call waits), 16 per session. Report tool call ``tool_id``'s rows as for any
        tool; its result is ``DelegationResult.text``. A child's failure is its result, never
        an exception; ``ToolUnavailable`` (one line) when no child may be started."""
        if self._delegator is None:
            raise ToolUnavailable("a child session cannot delegate to a session of its own")
        return await self._delegator.delegate(self, self._outlet, tool_id, title, prompt)

    def child_turn(
        self, outlet: RunOutlet, *, task_id: str, prompt: Prompt, model: str | None
    ) -> Turn:
        """The first turn of a child session's run (the runtime makes it): this turn's
        directories, skills and tools, its own prompt and an empty history, no delegation."""
        child = Turn(
            outlet,
            task_id=task_id,
            kind=RunKind.PROMPT,
            prompt=prompt,
            model=model,
            root=self.root,
            skills=self.skills,
            goal=None,
            tools=self.tools,
            offered_tools=self._offered_tools,
            read_blob=self._read_blob,
        )
        child.delegated = True
        # The session's tool notices stay with the parent's turn.
        self.tools.notify_through(self.notice)
        return child

    # -- steering: messages the user adds while the turn works ---------------------------------

    def steering(self) -> tuple[TimelineItem, ...]:
        """Take the steering messages the user sent since the last call, oldest first: user
        items (``kind`` ``USER``, ``text``), each already in the task's history, each returned
        once. Call it at each step where the model could take more input (before each model
        request); it never waits. Messages a turn does not take before ``run_turn`` returns
        become the ``prompt`` of a follow-up ``run_turn`` of the same run."""
        return self._outlet.steering.take()

    async def wait_steering(self) -> None:
        """Wait until a steering message is there to take (at once if one is)."""
        await self._outlet.steering.wait()

    # -- the session's mode and thinking effort (read live: a change applies from the next
    # -- tool call or model request) --------------------------------------------------------

    @property
    def offered_tools(self) -> tuple[ToolSpec, ...]:
        """Tools the runtime offers besides the backend's own native ones: ``external_mcp``
        (its exact tool ids in the schema) while the caller supplied MCP servers and the
        session's mode allows MCP calls."""
        return tuple(spec for spec in self._offered_tools if self.tool_allowed(spec.name))

    @property
    def mode(self) -> SessionMode:
        """The session's mode now."""
        return self._outlet.hooks.mode().mode

    @property
    def planning(self) -> bool:
        """The session's mode asks for a plan, not for changes: say so to the model."""
        return self._outlet.hooks.mode().policy.planning

    @property
    def roots(self) -> tuple[str, ...]:
        """The session's directories: the task's root first."""
        return self._outlet.hooks.roots

    @property
    def thought_level(self) -> str | None:
        """The thinking effort chosen for the task (one of the levels the backend declared for
        ``model``), or ``None`` for the backend's own default."""
        return self._outlet.hooks.thought_level()

    def boolean_option(self, option_id: str) -> bool:
        """The session's value of one of the backend's ``boolean_options`` (set for the task,
        else its default), read now: a change applies from the next decision. ``False`` for
        an option the backend does not declare."""
        return self._outlet.hooks.option_values().get(option_id, False)

    def tool_refusal(self, name: str, category: ToolCategory | None = None) -> str | None:
        """Why the session's mode forbids a call of tool ``name`` now (one line to end its row
        with), or ``None`` if it may be called. ``category`` places a backend's own tool; the
        shared tools' names (``shell``, ``read_file``, ``write_file``, ``edit_file``,
        ``update_plan``, ``external_mcp``) have a fixed one; an unplaced tool is ``OTHER``."""
        return self._outlet.hooks.mode().refusal(tool_category(name, category))

    def tool_allowed(self, name: str, category: ToolCategory | None = None) -> bool:
        """Whether the session's mode lets the backend offer and call tool ``name`` now."""
        return self.tool_refusal(name, category) is None

    def new_message_id(self) -> str:
        return self._outlet.next_id("m")

    async def send_text(self, text: str, *, message_id: str | None = None) -> str:
        """Agent message text; returns the message id used (the current text message unless
        one is given or another kind of event came in between)."""
        # The streaming hot path: one coroutine per chunk, awaiting only when the queue asks
        # for a wait or a scheduler pass (see RunEventQueue.offer).
        message_id, pending = self._outlet.put_text(ItemKind.ASSISTANT, text, message_id)
        if pending is not None:
            await self._outlet.send(pending)
        return message_id

    def send_text_nowait(self, text: str, *, message_id: str | None = None) -> str:
        """``send_text`` for a producer that cannot wait: if the queue is full the run is
        cancelled with a terminal notice instead."""
        return self._outlet.send_text_nowait(ItemKind.ASSISTANT, text, message_id)

    async def send_thought(self, text: str, *, message_id: str | None = None) -> str:
        return await self._outlet.send_text(ItemKind.THOUGHT, text, message_id)

    def sign_thought(self, message_id: str, signature: str) -> bool:
        """Keep a provider's ``signature`` of thought ``message_id`` (whole: one thinking
        block per message id) in the task history, so that a later turn can send that
        thinking back verbatim (``TimelineItem.signature``). Nothing is sent to the caller.
        False, and nothing kept, for an id this run did not use for a thought, a thought cut
        for length, or a signature past ``MAX_SIGNATURE_CHARS``."""
        return self._outlet.sign_thought(message_id, signature)

    async def keep_transcript(self, body: bytes) -> bool:
        """Keep ``body`` (opaque to the runtime: what the backend sent its model for this run,
        in its own encoding) with the task history, as covering this run's history so far
        (the pending text is written first). A later turn reads it from ``transcripts`` and
        can send the same bytes again instead of rebuilding them from the rows. False, and
        nothing kept, past ``MAX_TRANSCRIPT_BYTES``."""
        if len(body) > MAX_TRANSCRIPT_BYTES:
            return False
        await self._outlet.keep_transcript(body)
        return True

    async def transcripts(self) -> dict[str, bytes]:
        """The transcripts backends kept for this task's runs, by run id: only those that still
        cover their run's whole history (a run whose later rows no transcript covers is not
        there)."""
        return await self._outlet.transcripts()

    async def send_tool_row(self, tool_id: str, tool: ToolState) -> None:
        """Report a tool call's state; the first row of an id opens the call, later rows update
        it. Rows are also written to the task history."""
        await self._outlet.send_tool_row(tool_id, tool)

    # -- commands: live output, background commands ---------------------------------------

    async def run_shell(self, tool_id: str, command: str) -> ShellResult:
        """``tools.run_shell`` in the task's root, its output live on tool call ``tool_id``
        while it runs (``ToolOutput`` events: the bounded tail at most every 100 ms, the last
        one at exit). Report the call's final row as ever; ``ShellResult.tail`` is what it
        may show (``shell_row_text`` puts a failure's exit status first)."""

        async def live(output: ShellOutput) -> None:
            await self._outlet.send(ToolOutput(self.run_id, output))

        return await self.tools.run_shell(command, cwd=self.root, tool_id=tool_id, live=live)

    async def start_background(
        self, tool_id: str, command: str, *, title: str, raw_input: object = None
    ) -> str:
        """Start ``command`` in the background: it goes on past this call and this turn, in
        the session's own nursery, with its output live on tool call ``tool_id``, whose row
        (``in_progress``, the handle as its text) this sends; the command's end sends and
        stores its final row. Returns the handle (``bg-N``). ``ToolUnavailable`` (one line)
        when the session allows no more now (``MAX_BACKGROUND_COMMANDS`` run) or its mode
        forbids commands: end the row with it."""
        background = self._background()
        background.check_room()
        handle = background.next_handle()
        tool = ToolState(
            name="shell",
            status=ToolStatus.IN_PROGRESS,
            title=title,
            raw_input=raw_input,
            output_text=handle,
        )
        await self.send_tool_row(tool_id, tool)
        background.start(
            handle=handle,
            run_id=self.run_id,
            tool_id=tool_id,
            command=command,
            cwd=self.root,
            tool=tool,
        )
        self._outlet.detach_tool(tool_id)
        return handle

    def background_output(self, handle: str) -> str:
        """What background command ``handle`` printed since the last read (bounded, the
        latest), after one line saying whether it runs. ``ToolUnavailable`` for an unknown
        handle."""
        try:
            return self._background().read(handle)
        except KeyError:
            raise ToolUnavailable(
                f"no background command {handle[:40]!r} in this session"
            ) from None

    def kill_background(self, handle: str) -> str:
        """Stop background command ``handle`` (SIGTERM, then SIGKILL); one line saying so."""
        try:
            stopping = self._background().stop(handle)
        except KeyError:
            raise ToolUnavailable(
                f"no background command {handle[:40]!r} in this session"
            ) from None
        return f"stopping {handle}" if stopping else f"{handle} had already ended"

    def _background(self) -> BackgroundShells:
        background = self.tools.background
        if background is None:
            raise ToolUnavailable("background commands need a session")
        return background

    async def ask_permission(self, request: ToolRequest) -> bool:
        """Ask whether ``request`` may run. The session's mode decides first: a tool it
        forbids is False at once (nobody is asked; end the row with ``tool_refusal``), one it
        runs unasked (``auto-edit``: a write inside the session's directories) is True at once.
        Otherwise the host policy: allowed, True at once; else the run's caller answers; a
        deny, a cancellation or any invalid answer is False (the invalid ones also cancel the
        run)."""
        return await self._outlet.ask_permission(request)

    async def start_compaction(self) -> str:
        """Start a compaction of the conversation (the caller is told, if it follows them);
        returns its id. Send its summary with ``send_compaction_text`` and end it with
        ``end_compaction``; one still running when the turn ends is cancelled."""
        return await self._outlet.start_compaction()

    async def send_compaction_text(self, compaction_id: str, text: str) -> None:
        """A piece of a running compaction's summary."""
        await self._outlet.send_compaction_text(compaction_id, text)

    async def end_compaction(self, compaction_id: str, *, error: str | None = None) -> bool:
        """End a compaction: completed (its whole summary is stored as a ``COMPACTION`` row of
        the history, where it happened), or failed with ``error`` (nothing stored). True if it
        completed."""
        if error is not None:
            error = bounded_text(self._outlet.hooks.redactor.text(error))
        return await self._outlet.end_compaction(compaction_id, error) is not None

    async def report_usage(self, usage: Usage) -> None:
        """Add token usage to this run's total."""
        await self._outlet.add_usage(usage)

    async def send_plan(self, entries: Sequence[PlanEntry]) -> None:
        """The whole plan as it stands now (the caller replaces its previous one). It is
        also written to the task history, whose latest plan is replayed on load."""
        await self._outlet.send_plan(bounded_plan(entries))

    async def send_markdown_plan(self, markdown: str) -> None:
        """The whole plan as Markdown (it replaces the previous plan, whichever its form).
        An empty text clears the plan, like an empty list. Written to the history like
        :meth:`send_plan`."""
        await self._outlet.send_plan((), bounded_markdown_plan(markdown))

    async def report_context(self, used: int, size: int, *, cost_usd: float | None = None) -> None:
        """How many tokens of the model's context window are in use (``used`` may exceed
        ``size``), and the session's cumulative cost in USD when the backend has prices for
        the model (never an estimate without them). Not persisted."""
        for value in (used, size):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError("context usage is two integers >= 0")
        if cost_usd is not None and (
            not isinstance(cost_usd, (int, float)) or not math.isfinite(cost_usd) or cost_usd < 0
        ):
            raise ValueError("a cost is a finite number >= 0")
        await self._outlet.send(ContextUsage(self.run_id, used, size, cost_usd))

    async def set_commands(self, commands: Sequence[CommandInfo]) -> None:
        """Replace the commands the backend offers (each a prompt starting with
        ``/name``); the caller is told, and the lease's ``commands`` hold them from now."""
        await self._outlet.send_commands(bounded_commands(commands))

    async def set_title(self, title: str) -> None:
        title = bounded_text(title, MAX_TITLE_CHARS)
        await self._outlet.hooks.set_title(title)
        await self._outlet.send(TitleChanged(self.run_id, title))

    async def notice(
        self,
        level_or_text: str,
        text: str | None = None,
        *,
        level: NoticeLevel | None = None,
        fallback: NoticeFallback = "text",
    ) -> None:
        """Tell the user something about the run that is not the agent's answer (a retry, a
        long wait, a dropped server): ``notice(level, text)`` with ``level`` one of ``info``,
        ``warning``, ``error``; ``notice(text)`` and ``notice(text, level=...)`` work too (the
        level defaults to ``info``). Always logged; a caller that shows notices gets it as one,
        others as visible text, or as a thought with ``fallback="thought"`` (for what the
        agent goes through, such as waiting on its provider, rather than something to read in
        its answer)."""
        if text is None:
            text, chosen = level_or_text, level or "info"
        elif level_or_text in NOTICE_LEVELS and level is None:
            chosen = level_or_text
        else:
            raise ValueError(f"a notice level is one of {', '.join(NOTICE_LEVELS)}")
        text = bounded_text(self._outlet.hooks.redactor.text(text))
        logger.log(_LOG_LEVELS[chosen], "run %s notice (%s): %s", self.run_id, chosen, text)
        await self._outlet.send(RunNotice(self.run_id, text, level=chosen, fallback=fallback))

    async def set_goal(self, objective: str, *, token_budget: int | None = None) -> GoalRecord:
        """Give the task a (new) active goal, as a caller's ``set`` would."""
        return await self._outlet.hooks.set_goal(objective, token_budget)
