"""The deterministic demo backend: its "model" reads the prompt as a tiny script.

This module is the demo's one concern, its script: the grammar and what each directive does.

So that the service runs on a machine with no model provider, this backend answers every turn
from the prompt text alone. A line that starts with ``/`` and a name (letters, digits, ``_``,
``-``) followed by a space or the line's end is a directive; any other line is agent text,
echoed back (consecutive lines as one message): ``/usr/bin/env is missing`` is text. With the
session's boolean option ``brief`` on ("answer in one line"; off by default), each echoed
message is cut to its first line. Directives:

``/echo TEXT``
    TEXT as an agent message.
``/think TEXT``
    TEXT as a thought.
``/stream N SIZE``
    N agent-message chunks of SIZE bytes each, in one message (the benchmark load).
``/burst N SIZE``
    Like ``/stream`` but sent without waiting for queue room, as a producer that cannot wait
    would: more than the run's queue holds cancels the run with an overflow notice.
``/hang``
    Wait until the run is cancelled.
``/listen``
    Wait until the user steers the turn (``Turn.wait_steering``), then go on.
``/fail MESSAGE``
    End the turn as failed with MESSAGE (``TurnFailed``); lines after it do not run. The run's
    outcome is ``FAILED`` with MESSAGE as its failure text, which its caller receives as a
    terminal notice. An ACP client sees what the script sent before, then MESSAGE as agent
    text in a message of its own, then the prompt's answer with ``stopReason: "end_turn"``
    (a failed turn may already have had effects, so it is not reported as a refusal). MESSAGE
    is not kept in the task's history, so a later ``session/load`` does not replay it.
``/usage IN OUT``
    Report IN input and OUT output tokens for this run.
``/context USED SIZE``
    Report that USED of SIZE tokens of the context window are in use.
``/plan STEP; STEP; ...``
    Send the whole plan: one entry per ``;``-separated step, in order. A step that starts with
    ``[x]`` is completed, ``[>]`` in progress, anything else (or ``[ ]``) pending. ``/plan``
    alone sends an empty plan. ``/plan-md TEXT``: the plan as Markdown (``\\n``: a new line).
``/title TEXT``
    Rename the task (not as a user rename).
``/tool shell {"command": "..."}``
    A native ``shell`` call. It asks permission (the demo policy asks for ``shell``); on allow
    it runs the command in its own process group (host environment plus relay values), its
    output live on the row, then its exit code and the tail of its output; killed when the
    run is cancelled or the session revoked. ``/bg COMMAND`` runs the rest of the line in
    the background: a handle at once, the row live past the turn until the command exits.
``/tool write_file {"path": "...", "content": "..."}``
    A native file write. The path (relative paths start at the task's directory) must resolve
    inside the task's directory; one that escapes it (or names a file that is not UTF-8 text)
    ends the row as failed, without asking. Otherwise the row carries the diff and the file's
    location, the demo policy asks, and on allow the file is written (created if new).
``/delegate TITLE :: PROMPT``
    Delegate PROMPT to a child session (``backends/_demo_delegate.py``): its scripted turn
    streams what it works on, runs ``echo child`` through its own permission, and answers;
    a PROMPT that holds directive lines runs as the child's script instead.
``/mcp ID {json arguments}``
    An ``external_mcp`` call of tool ID through the session's router (always asked first); a
    clear tool error when the session has no external tools.

A tool the session's mode forbids (``shell``, ``write_file`` and MCP calls in ``ask`` and
``plan`` mode) ends its row as failed with the mode's reason, without asking; in ``auto-edit``
mode a ``write_file`` inside the task's directory runs without asking (its diff still shown).
``/goal OBJECTIVE``
    Give the task an active goal.
``/compact`` (or ``/compact fail``)
    A compaction: its summary names how many earlier user and agent messages there are and
    starts each with a line of its own; ``fail`` ends it failed instead (nothing stored).

Images and embedded text resources (``prompt_capabilities``: both accepted, for every demo
model) are not read as script: the turn first answers one message describing each (``image
1: image/png image, 640x480, 12345 bytes``; ``resource file:///a.py: 1200 bytes of text``),
then runs the script of the prompt's own text.

Steering: after each directive (and before the turn ends) the demo takes the steering
messages that arrived (``Turn.steering()``) and answers each as agent text ``steered: TEXT``.

Any other ``/name`` line sends a notice that lists the directives (and runs nothing). The
directives are also the backend's available commands (``available_commands``), which ACP
clients show as slash commands.

Goal cycles: each autonomous cycle sends ``goal cycle K: OBJECTIVE`` (K counts from 1) and
reports 2 tokens of usage; the objective scripts how the goal ends:

- contains ``hang``: the cycle waits until cancelled (a prompt preempts it);
- contains ``block``: the first cycle ends the goal ``blocked``;
- contains ``limit``: the first cycle ends it ``limited``;
- contains ``complete after N``: the N-th cycle ends it ``complete``;
- otherwise the third cycle ends it ``complete``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import trio

from maple_acp.backends import _demo_delegate as demo_delegate
from maple_acp.backends import _demo_tools as demo_tools
from maple_acp.runtime import (
    MAX_PLAN_ENTRIES,
    AskForTools,
    Backend,
    BooleanOption,
    CommandInfo,
    GoalProgress,
    GoalStatus,
    ItemKind,
    ModelInfo,
    PlanEntry,
    PlanStatus,
    PromptCapabilities,
    RunKind,
    StaticModelCatalog,
    Turn,
    TurnFailed,
    TurnResult,
    Usage,
    describe_image,
)

logger = logging.getLogger(__name__)

#: ``/stream`` and ``/burst`` refuse larger loads: a typo must not pin the host.
MAX_STREAM_CHUNKS = 10_000_000
MAX_STREAM_CHUNK_BYTES = 1024 * 1024
#: How much of an unknown directive's name a notice repeats.
MAX_ECHOED_NAME_CHARS = 64
#: A ``/compact`` summary names at most this many messages, each by its first line, cut.
MAX_SUMMARY_LINES = 50
MAX_SUMMARY_LINE_CHARS = 80
#: Cycles before a goal without a script completes.
DEFAULT_GOAL_CYCLES = 3

DEMO_MODELS = (
    ModelInfo(id="demo-echo", name="Demo echo", description="Echoes the prompt script"),
    ModelInfo(id="demo-echo-large", name="Demo echo (large)", description="The same, larger"),
    ModelInfo(id="demo-embed", name="Demo embedding", chat=False),
)

#: The script's directives, as the available commands a client shows (in this order).
DEMO_COMMANDS = (
    CommandInfo(name="echo", description="Send TEXT as an agent message", input_hint="TEXT"),
    CommandInfo(name="think", description="Send TEXT as a thought", input_hint="TEXT"),
    CommandInfo(
        name="stream", description="Send N chunks of SIZE bytes as one message", input_hint="N SIZE"
    ),
    CommandInfo(
        name="burst",
        description="Like stream, without waiting for the queue (overflow cancels)",
        input_hint="N SIZE",
    ),
    CommandInfo(name="hang", description="Wait until the turn is cancelled"),
    CommandInfo(name="listen", description="Wait until the turn is steered"),
    CommandInfo(
        name="fail", description="End the turn as failed with MESSAGE", input_hint="MESSAGE"
    ),
    CommandInfo(
        name="usage", description="Report this turn's input and output tokens", input_hint="IN OUT"
    ),
    CommandInfo(
        name="context",
        description="Report USED of SIZE context-window tokens in use",
        input_hint="USED SIZE",
    ),
    CommandInfo(
        name="plan",
        description="Send a plan; steps split by ';', [x] completed, [>] in progress",
        input_hint="[x] STEP; [>] STEP; STEP",
    ),
    CommandInfo(name="plan-md", description="Send a Markdown plan", input_hint="MARKDOWN"),
    CommandInfo(name="title", description="Rename the session", input_hint="TEXT"),
    CommandInfo(
        name="tool",
        description="Call a native tool (shell, write_file) with JSON arguments",
        input_hint='write_file {"path": "...", "content": "..."}',
    ),
    CommandInfo(name="bg", description="Run a command in the background", input_hint="COMMAND"),
    CommandInfo(
        name="mcp",
        description="Call a tool of the session's MCP servers",
        input_hint="ID {json arguments}",
    ),
    CommandInfo(
        name="delegate",
        description="Delegate PROMPT to a child session",
        input_hint="TITLE :: PROMPT",
    ),
    CommandInfo(name="goal", description="Give the session an active goal", input_hint="OBJECTIVE"),
    CommandInfo(name="compact", description="Summarize the session so far (a compaction)"),
)

_PLAN_MARKERS = {
    "[x]": PlanStatus.COMPLETED,
    "[X]": PlanStatus.COMPLETED,
    "[>]": PlanStatus.IN_PROGRESS,
    "[ ]": PlanStatus.PENDING,
}
_COMPLETE_AFTER = re.compile(r"complete after (\d+)")


def demo_catalog() -> StaticModelCatalog:
    """The demo's catalog: a default chat model, one alternative, and a non-chat model that
    the runtime filters out."""
    return StaticModelCatalog(DEMO_MODELS)


def demo_policy() -> AskForTools:
    """The demo's permission policy: ask for ``shell`` and ``write_file`` (``external_mcp`` is
    always asked)."""
    return AskForTools(frozenset({"shell", "write_file"}))


def parse_plan(text: str) -> tuple[PlanEntry, ...]:
    """The entries of ``/plan``'s argument (see the module docstring)."""
    entries: list[PlanEntry] = []
    for step in text.split(";"):
        step = step.strip()
        status = PlanStatus.PENDING
        for marker, marked in _PLAN_MARKERS.items():
            if step.startswith(marker):
                step, status = step[len(marker) :].strip(), marked
                break
        if step:
            entries.append(PlanEntry(content=step, status=status))
    if len(entries) > MAX_PLAN_ENTRIES:
        raise TurnFailed(f"/plan takes at most {MAX_PLAN_ENTRIES} steps")
    return tuple(entries)


_Directive = Callable[["DemoBackend", Turn, str], Awaitable[None]]

#: The demo's one boolean option: echoed text cut to its first line.
BRIEF_OPTION = BooleanOption(id="brief", name="Brief", description="Answer in one line")
#: A directive line: ``/`` and a name, then a space or the end. ``/usr/bin/env is missing`` or
#: ``/ 2`` is text.
_DIRECTIVE_LINE = re.compile(r"/[A-Za-z0-9_-]+(?: |$)")


class DemoBackend(Backend):
    """A deterministic ``AgentBackend``; see the module docstring for its script grammar."""

    #: Every demo model takes images and embedded text resources, and describes them.
    prompt_capabilities = PromptCapabilities(image=True, embedded_context=True)

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return DEMO_COMMANDS

    def boolean_options(self) -> tuple[BooleanOption, ...]:
        return (BRIEF_OPTION,)

    async def run_turn(self, turn: Turn) -> TurnResult | None:
        if turn.kind is RunKind.GOAL_CYCLE:
            return TurnResult(goal_progress=await self._goal_cycle(turn))
        script = turn.prompt
        if turn.delegated and not any(map(_DIRECTIVE_LINE.match, script.splitlines())):
            await demo_delegate.scripted_child(turn)
            return None
        described = [
            f"image {number}: {describe_image(image)}"
            for number, image in enumerate(turn.images, 1)
        ]
        for resource in turn.resources:
            # The resource's text is the client's file, not script: it is described, not run.
            script = script.replace(resource.rendered, "", 1)
            size = len(resource.text.encode("utf-8", "surrogatepass"))
            described.append(f"resource {resource.uri}: {size} bytes of text")
        # After a description, the script's first text is a message of its own.
        text_id: str | None = None
        if described:
            await turn.send_text("\n".join(described), message_id=turn.new_message_id())
            script, text_id = script.strip("\n"), turn.new_message_id()
        plain: list[str] = []
        for line in script.splitlines():
            if not _DIRECTIVE_LINE.match(line):
                plain.append(line)
                continue
            if plain:
                await turn.send_text(_echoed(turn, plain), message_id=text_id)
                plain.clear()
            await self._directive(turn, line)
            text_id = None
            await _answer_steering(turn)
        if plain:
            await turn.send_text(_echoed(turn, plain), message_id=text_id)
        await _answer_steering(turn)
        return None

    async def _directive(self, turn: Turn, line: str) -> None:
        name, _, rest = line[1:].partition(" ")
        handler = _DIRECTIVES.get(name)
        if handler is None:
            known = ", ".join(f"/{command.name}" for command in DEMO_COMMANDS)
            shown = name[:MAX_ECHOED_NAME_CHARS]
            await turn.notice(f"The demo has no directive /{shown}. Directives: {known}.")
            return
        await handler(self, turn, rest.strip())

    async def _echo(self, turn: Turn, rest: str) -> None:
        await turn.send_text(rest, message_id=turn.new_message_id())

    async def _think(self, turn: Turn, rest: str) -> None:
        await turn.send_thought(rest)

    async def _stream(self, turn: Turn, rest: str) -> None:
        await self._chunks(turn, "stream", rest)

    async def _burst(self, turn: Turn, rest: str) -> None:
        await self._chunks(turn, "burst", rest)

    async def _chunks(self, turn: Turn, name: str, rest: str) -> None:
        count, size = _two_ints(name, rest)
        if not (count <= MAX_STREAM_CHUNKS and size <= MAX_STREAM_CHUNK_BYTES):
            raise TurnFailed(f"/{name} is limited to {MAX_STREAM_CHUNKS} chunks of 1 MiB")
        chunk = "x" * size
        message_id = turn.new_message_id()
        if name == "stream":
            send = turn.send_text
            for _ in range(count):
                await send(chunk, message_id=message_id)
        else:
            for _ in range(count):
                turn.send_text_nowait(chunk, message_id=message_id)
            await trio.lowlevel.checkpoint()

    async def _hang(self, turn: Turn, rest: str) -> None:
        await trio.sleep_forever()

    async def _listen(self, turn: Turn, rest: str) -> None:
        await turn.wait_steering()

    async def _fail(self, turn: Turn, rest: str) -> None:
        raise TurnFailed(rest or "the demo turn failed")

    async def _usage(self, turn: Turn, rest: str) -> None:
        tokens_in, tokens_out = _two_ints("usage", rest)
        await turn.report_usage(
            Usage(
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                total_tokens=tokens_in + tokens_out,
            )
        )

    async def _context(self, turn: Turn, rest: str) -> None:
        used, size = _two_ints("context", rest)
        await turn.report_context(used, size)

    async def _plan(self, turn: Turn, rest: str) -> None:
        await turn.send_plan(parse_plan(rest))

    async def _title(self, turn: Turn, rest: str) -> None:
        await turn.set_title(rest)

    async def _tool(self, turn: Turn, rest: str) -> None:
        tool, _, args = rest.partition(" ")
        if tool == "shell":
            await demo_tools.shell(turn, _json_object(args))
        elif tool == "write_file":
            await demo_tools.write_file(turn, _json_object(args))
        else:
            raise TurnFailed(f"the demo has no native tool named {tool[:64]!r}")

    async def _mcp(self, turn: Turn, rest: str) -> None:
        tool_id, _, args = rest.partition(" ")
        await demo_tools.external(turn, tool_id, _json_object(args) if args.strip() else {})

    async def _goal(self, turn: Turn, rest: str) -> None:
        goal = await turn.set_goal(rest)
        await turn.send_text(f"goal set: {goal.objective}", message_id=turn.new_message_id())

    async def _compact(self, turn: Turn, rest: str) -> None:
        earlier = [
            item
            for item in turn.history
            if item.kind in (ItemKind.USER, ItemKind.ASSISTANT) and item.text.strip()
        ]
        compaction_id = await turn.start_compaction()
        await turn.send_compaction_text(compaction_id, f"{len(earlier)} earlier messages.")
        for item in earlier[-MAX_SUMMARY_LINES:]:
            first = item.text.strip().splitlines()[0][:MAX_SUMMARY_LINE_CHARS]
            await turn.send_compaction_text(compaction_id, f"\n- {item.kind.value}: {first}")
        await turn.end_compaction(compaction_id, error="asked to fail" if rest == "fail" else None)

    async def _goal_cycle(self, turn: Turn) -> GoalProgress:
        goal = turn.goal
        objective = turn.prompt
        cycle = (goal.iterations if goal is not None else 0) + 1
        await turn.send_text(f"goal cycle {cycle}: {objective}", message_id=turn.new_message_id())
        await turn.report_usage(Usage(input_tokens=1, output_tokens=1, total_tokens=2))
        lowered = objective.lower()
        if "hang" in lowered:
            await trio.sleep_forever()
        if "block" in lowered:
            return GoalProgress(status=GoalStatus.BLOCKED, reason="the script blocks")
        if "limit" in lowered:
            return GoalProgress(status=GoalStatus.LIMITED, reason="the script limits")
        match = _COMPLETE_AFTER.search(lowered)
        needed = int(match.group(1)) if match else DEFAULT_GOAL_CYCLES
        if cycle >= needed:
            return GoalProgress(status=GoalStatus.COMPLETE, reason="done")
        return GoalProgress(reason=f"{needed - cycle} cycles to go")


_DIRECTIVES: dict[str, _Directive] = {
    "echo": DemoBackend._echo,
    "think": DemoBackend._think,
    "stream": DemoBackend._stream,
    "burst": DemoBackend._burst,
    "hang": DemoBackend._hang,
    "listen": DemoBackend._listen,
    "fail": DemoBackend._fail,
    "usage": DemoBackend._usage,
    "context": DemoBackend._context,
    "plan": DemoBackend._plan,
    "plan-md": lambda demo, turn, rest: turn.send_markdown_plan(rest.replace("\\n", "\n")),
    "title": DemoBackend._title,
    "tool": DemoBackend._tool,
    "bg": lambda demo, turn, rest: demo_tools.shell(turn, {"command": rest, "background": True}),
    "mcp": DemoBackend._mcp,
    "delegate": lambda demo, turn, rest: demo_delegate.delegate(turn, rest),
    "goal": DemoBackend._goal,
    "compact": DemoBackend._compact,
}


def _echoed(turn: Turn, lines: list[str]) -> str:
    """Consecutive plain lines as the message that echoes them: their first line alone while
    the session's ``brief`` option is on."""
    return lines[0] if turn.boolean_option(BRIEF_OPTION.id) else "\n".join(lines)


async def _answer_steering(turn: Turn) -> None:
    """Answer each steering message that arrived, as its own agent message."""
    for item in turn.steering():
        await turn.send_text(f"steered: {item.text}", message_id=turn.new_message_id())


def _two_ints(name: str, rest: str) -> tuple[int, int]:
    parts = rest.split()
    try:
        first, second = (int(part) for part in parts)
    except ValueError:
        raise TurnFailed(f"/{name} takes two integers") from None
    if first < 0 or second < 0:
        raise TurnFailed(f"/{name} takes two integers of at least 0")
    return first, second


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise TurnFailed("tool arguments must be a JSON object") from None
    if not isinstance(value, dict):
        raise TurnFailed("tool arguments must be a JSON object")
    return value
