"""The deterministic demo backend: its "model" reads the prompt as a tiny script.

So that the service runs on a machine with no model provider, this backend answers every turn
from the prompt text alone. Lines that start with ``/`` are directives; any other line is agent
text, echoed back (consecutive lines as one message). Directives:

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
``/fail MESSAGE``
    End the turn as failed with MESSAGE.
``/usage IN OUT``
    Report IN input and OUT output tokens for this run.
``/title TEXT``
    Rename the task (not as a user rename).
``/tool shell {"command": "..."}``
    A native ``shell`` call. It asks permission (the demo policy asks for ``shell``); on allow
    it runs the command with ``/bin/sh`` in its own process group, with the host environment
    plus this session's relay values, and reports its exit code and (bounded) output. The
    process group is killed when the run is cancelled or the session revoked.
``/mcp ID {json arguments}``
    An ``external_mcp`` call of tool ID through the session's router (always asked first); a
    clear tool error when the session has no external tools.
``/goal OBJECTIVE``
    Give the task an active goal.

Goal cycles: each autonomous cycle sends ``goal cycle K: OBJECTIVE`` (K counts from 1) and
reports 2 tokens of usage; the objective itself scripts how the goal ends:

- contains ``hang``: the cycle waits until cancelled (a prompt preempts it);
- contains ``block``: the first cycle ends the goal ``blocked``;
- contains ``limit``: the first cycle ends it ``limited``;
- contains ``complete after N``: the N-th cycle ends it ``complete``;
- otherwise the third cycle ends it ``complete``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
import trio

from maple_acp.runtime import (
    EXTERNAL_MCP_TOOL,
    AskForTools,
    GoalProgress,
    GoalStatus,
    ModelInfo,
    RunKind,
    StaticModelCatalog,
    ToolRequest,
    ToolState,
    ToolStatus,
    ToolUnavailable,
    Turn,
    TurnFailed,
    Usage,
)

logger = logging.getLogger(__name__)

#: ``/stream`` and ``/burst`` refuse larger loads: a typo must not pin the host.
MAX_STREAM_CHUNKS = 10_000_000
MAX_STREAM_CHUNK_BYTES = 1024 * 1024
#: Tool output text shown in a row; the raw output keeps the rest (already bounded by the tool).
MAX_TOOL_TEXT_CHARS = 16_000
#: Cycles before a goal without a script completes.
DEFAULT_GOAL_CYCLES = 3

DEMO_MODELS = (
    ModelInfo(id="demo-echo", name="Demo echo", description="Echoes the prompt script"),
    ModelInfo(id="demo-echo-large", name="Demo echo (large)", description="The same, larger"),
    ModelInfo(id="demo-embed", name="Demo embedding", chat=False),
)

_COMPLETE_AFTER = re.compile(r"complete after (\d+)")


def demo_catalog() -> StaticModelCatalog:
    """The demo's catalog: a default chat model, one alternative, and a non-chat model that
    the runtime filters out."""
    return StaticModelCatalog(DEMO_MODELS)


def demo_policy() -> AskForTools:
    """The demo's permission policy: ask for ``shell`` (``external_mcp`` is always asked)."""
    return AskForTools(frozenset({"shell"}))


class DemoBackend:
    """A deterministic ``AgentBackend``; see the module docstring for its script grammar."""

    async def run_turn(self, turn: Turn) -> None:
        if turn.kind is RunKind.GOAL_CYCLE:
            await self._goal_cycle(turn)
            return
        plain: list[str] = []
        for line in turn.prompt.splitlines():
            if not line.startswith("/"):
                plain.append(line)
                continue
            if plain:
                await turn.send_text("\n".join(plain))
                plain.clear()
            await self._directive(turn, line)
        if plain:
            await turn.send_text("\n".join(plain))

    async def _directive(self, turn: Turn, line: str) -> None:
        name, _, rest = line[1:].partition(" ")
        rest = rest.strip()
        if name == "echo":
            await turn.send_text(rest, message_id=turn.new_message_id())
        elif name == "think":
            await turn.send_thought(rest)
        elif name in ("stream", "burst"):
            count, size = _two_ints(line, rest)
            if not (0 <= count <= MAX_STREAM_CHUNKS and 0 <= size <= MAX_STREAM_CHUNK_BYTES):
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
        elif name == "hang":
            await trio.sleep_forever()
        elif name == "fail":
            raise TurnFailed(rest or "the demo turn failed")
        elif name == "usage":
            tokens_in, tokens_out = _two_ints(line, rest)
            await turn.report_usage(
                Usage(
                    input_tokens=tokens_in,
                    output_tokens=tokens_out,
                    total_tokens=tokens_in + tokens_out,
                )
            )
        elif name == "title":
            await turn.set_title(rest)
        elif name == "tool":
            tool, _, args = rest.partition(" ")
            if tool != "shell":
                raise TurnFailed(f"the demo has no native tool named {tool[:64]!r}")
            await self._shell(turn, _json_object(args))
        elif name == "mcp":
            tool_id, _, args = rest.partition(" ")
            await self._external(turn, tool_id, _json_object(args) if args.strip() else {})
        elif name == "goal":
            goal = await turn.set_goal(rest)
            await turn.send_text(f"goal set: {goal.objective}", message_id=turn.new_message_id())
        else:
            await turn.send_text(line)

    async def _shell(self, turn: Turn, args: dict[str, Any]) -> None:
        command = args.get("command")
        tool_id = f"{turn.run_id}-shell-{turn.new_message_id()}"
        title = f"shell: {command}" if isinstance(command, str) else "shell"
        raw_input = {"command": command}
        await turn.send_tool_row(
            tool_id,
            ToolState(name="shell", status=ToolStatus.PENDING, title=title, raw_input=raw_input),
        )
        if not isinstance(command, str) or not command:
            await _finish(turn, tool_id, "shell", title, ToolStatus.FAILED, "no command given")
            return
        request = ToolRequest(tool_id=tool_id, name="shell", title=title, raw_input=raw_input)
        if not await turn.ask_permission(request):
            await _finish(turn, tool_id, "shell", title, ToolStatus.FAILED, "permission denied")
            return
        await turn.send_tool_row(
            tool_id, ToolState(name="shell", status=ToolStatus.IN_PROGRESS, title=title)
        )
        try:
            result = await turn.tools.run_shell(command, cwd=turn.root)
        except (ToolUnavailable, OSError) as exc:
            await _finish(turn, tool_id, "shell", title, ToolStatus.FAILED, str(exc))
            return
        status = ToolStatus.COMPLETED if result.exit_code == 0 else ToolStatus.FAILED
        await _finish(
            turn,
            tool_id,
            "shell",
            title,
            status,
            result.output,
            raw_output={
                "exit_code": result.exit_code,
                "output": result.output,
                "truncated": result.truncated,
            },
        )

    async def _external(self, turn: Turn, tool_id: str, arguments: dict[str, Any]) -> None:
        call_id = f"{turn.run_id}-mcp-{turn.new_message_id()}"
        title = f"external_mcp: {tool_id}"
        raw_input = {"tool": tool_id, "arguments": arguments}
        await turn.send_tool_row(
            call_id,
            ToolState(
                name=EXTERNAL_MCP_TOOL, status=ToolStatus.PENDING, title=title, raw_input=raw_input
            ),
        )
        request = ToolRequest(
            tool_id=call_id, name=EXTERNAL_MCP_TOOL, title=title, raw_input=raw_input
        )
        if not await turn.ask_permission(request):
            await _finish(
                turn, call_id, EXTERNAL_MCP_TOOL, title, ToolStatus.FAILED, "permission denied"
            )
            return
        try:
            result = await turn.tools.call_external(tool_id, arguments)
        except Exception as exc:
            message = str(exc) or type(exc).__name__
            await _finish(turn, call_id, EXTERNAL_MCP_TOOL, title, ToolStatus.FAILED, message)
            return
        text = orjson.dumps(result).decode()
        await _finish(
            turn, call_id, EXTERNAL_MCP_TOOL, title, ToolStatus.COMPLETED, text, raw_output=result
        )

    async def _goal_cycle(self, turn: Turn) -> None:
        goal = turn.goal
        objective = turn.prompt
        cycle = (goal.iterations if goal is not None else 0) + 1
        await turn.send_text(f"goal cycle {cycle}: {objective}", message_id=turn.new_message_id())
        await turn.report_usage(Usage(input_tokens=1, output_tokens=1, total_tokens=2))
        lowered = objective.lower()
        if "hang" in lowered:
            await trio.sleep_forever()
        if "block" in lowered:
            turn.goal_progress = GoalProgress(status=GoalStatus.BLOCKED, reason="the script blocks")
            return
        if "limit" in lowered:
            turn.goal_progress = GoalProgress(status=GoalStatus.LIMITED, reason="the script limits")
            return
        match = _COMPLETE_AFTER.search(lowered)
        needed = int(match.group(1)) if match else DEFAULT_GOAL_CYCLES
        if cycle >= needed:
            turn.goal_progress = GoalProgress(status=GoalStatus.COMPLETE, reason="done")
        else:
            turn.goal_progress = GoalProgress(reason=f"{needed - cycle} cycles to go")


async def _finish(
    turn: Turn,
    tool_id: str,
    name: str,
    title: str,
    status: ToolStatus,
    text: str,
    *,
    raw_output: Any = None,
) -> None:
    await turn.send_tool_row(
        tool_id,
        ToolState(
            name=name,
            status=status,
            title=title,
            raw_output=raw_output,
            output_text=text[:MAX_TOOL_TEXT_CHARS],
        ),
    )


def _two_ints(line: str, rest: str) -> tuple[int, int]:
    parts = rest.split()
    try:
        first, second = (int(part) for part in parts)
    except ValueError:
        raise TurnFailed(f"{line.split()[0]} takes two integers") from None
    return first, second


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise TurnFailed("tool arguments must be a JSON object") from None
    if not isinstance(value, dict):
        raise TurnFailed("tool arguments must be a JSON object")
    return value
