"""The tools the model sees, and how one call of them runs as a tool row.

``shell`` asks (by the host's policy) and runs through the lease's tool context, its output
live on its row (``background: true``: past the call, read with ``shell_output`` and stopped
with ``shell_kill``);
``read_file`` needs no permission and stays inside the session's directories; ``write_file`` and
``edit_file`` ask, showing the diff they would make, then make it; ``external_mcp`` (when the
session has MCP servers) is always asked by the runtime. The session's mode decides which of
them the model is offered, and a call of one it forbids fails its row without asking.
``delegate`` (every mode; never to a child session's turn) hands a task to a child session
and returns its answer; the calls of one model answer run together, at most four at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import orjson
import trio

from maple_acp.model import FileDiff, PlanEntry, PlanPriority, PlanStatus, ToolLocation
from maple_acp.runtime import (
    EXTERNAL_MCP_TOOL,
    MAX_PLAN_MARKDOWN_CHARS,
    FileChange,
    FileToolError,
    RunState,
    ToolRequest,
    ToolState,
    ToolStatus,
    ToolUnavailable,
    Turn,
    exit_line,
    read_text_async,
    shell_row_text,
)

#: Text of a tool's result shown in its row; the model gets its own bound.
MAX_ROW_TEXT_CHARS = 16_000
#: A model's arguments for one call; more is refused without being parsed.
MAX_ARGUMENT_CHARS = 4 * 1024 * 1024

SHELL = "shell"
SHELL_OUTPUT = "shell_output"
SHELL_KILL = "shell_kill"
READ_FILE = "read_file"
WRITE_FILE = "write_file"
EDIT_FILE = "edit_file"
UPDATE_PLAN = "update_plan"
DELEGATE = "delegate"
#: Lines ``read_file`` returns unless asked for fewer: a window the model can page through.
READ_LINES = 2000
#: Entries of one plan; a longer list is a model rambling, not a plan.
MAX_PLAN_ENTRIES = 64

DENIED = "the user denied this tool call"


def _spec(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


NATIVE_TOOLS: tuple[Any, ...] = (
    _spec(
        SHELL,
        "Run a shell command (/bin/sh) in the project directory; returns its exit code and "
        "combined output. The user is asked first. With background: true it returns a handle "
        "at once and the command goes on (a server, a watcher): read it with shell_output, "
        "stop it with shell_kill.",
        {
            "command": {"type": "string", "description": "The command line."},
            "background": {"type": "boolean", "description": "Run on past this call."},
        },
        ["command"],
    ),
    _spec(
        SHELL_OUTPUT,
        "What a background command printed since you last read it, and whether it runs.",
        {"handle": {"type": "string", "description": "The handle shell gave (bg-N)."}},
        ["handle"],
    ),
    _spec(
        SHELL_KILL,
        "Stop a background command.",
        {"handle": {"type": "string", "description": "The handle shell gave (bg-N)."}},
        ["handle"],
    ),
    _spec(
        READ_FILE,
        "Read a UTF-8 text file inside the project directory, a window of lines at a time.",
        {
            "path": {"type": "string", "description": "Relative to the project directory."},
            "start_line": {"type": "integer", "description": "First line to read (from 1)."},
            "max_lines": {"type": "integer", "description": f"At most {READ_LINES} by default."},
        },
        ["path"],
    ),
    _spec(
        WRITE_FILE,
        "Create or replace a text file inside the project directory. The user sees the diff "
        "and is asked first.",
        {
            "path": {"type": "string", "description": "Relative to the project directory."},
            "content": {"type": "string", "description": "The whole new content."},
        },
        ["path", "content"],
    ),
    _spec(
        EDIT_FILE,
        "Replace exactly one occurrence of old_text with new_text in a text file inside the "
        "project directory. The user sees the diff and is asked first.",
        {
            "path": {"type": "string", "description": "Relative to the project directory."},
            "old_text": {"type": "string", "description": "Text that occurs exactly once."},
            "new_text": {"type": "string", "description": "Its replacement."},
        },
        ["path", "old_text", "new_text"],
    ),
)


PLAN_TOOL = _spec(
    UPDATE_PLAN,
    "Show the user your plan for this task, the whole plan each time: either entries (a list "
    "of steps, updated as they start and finish) or markdown (the plan as a Markdown "
    "document), never both. An empty list or text clears the plan.",
    {
        "entries": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "content": {"type": "string"},
                    "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                    "priority": {"type": "string", "enum": ["high", "medium", "low"]},
                },
                "required": ["content", "status"],
            },
        },
        "markdown": {
            "type": "string",
            "description": f"The plan as Markdown, at most {MAX_PLAN_MARKDOWN_CHARS} characters.",
        },
    },
    [],
)


DELEGATE_TOOL = _spec(
    DELEGATE,
    "Hand a self-contained task to a helper session and get its final answer back. The "
    "helper works in the same project and mode with the same tools, but sees only your "
    "prompt, not this conversation: say everything it needs. Several calls in one answer "
    "run together.",
    {
        "title": {"type": "string", "description": "A short name for the task, shown to the user."},
        "prompt": {"type": "string", "description": "The whole task, with what it needs."},
    },
    ["title", "prompt"],
)


def offered_tools(turn: Turn) -> list[Any]:
    """The native tools and ``update_plan`` that the session's mode allows now, ``delegate``
    unless the turn is a child session's, plus what the turn offers (``external_mcp`` while
    the session has MCP servers and the mode allows it)."""
    tools = [
        spec for spec in (*NATIVE_TOOLS, PLAN_TOOL) if turn.tool_allowed(spec["function"]["name"])
    ]
    if turn.can_delegate:
        # Every mode: the child inherits the mode, and its own calls meet it.
        tools.append(DELEGATE_TOOL)
    for spec in turn.offered_tools:
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": dict(spec.input_schema),
                },
            }
        )
    return tools


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call the model asked for, assembled from its streamed fragments."""

    call_id: str
    name: str
    #: The JSON text the model sent; ``None`` when it exceeded ``MAX_ARGUMENT_CHARS``.
    arguments: str | None


@attrs.frozen(kw_only=True)
class ToolResult:
    """What the model is told about a call."""

    content: str


async def run_tool_call(turn: Turn, call: ToolCall, row_id: str) -> ToolResult:
    """Run one call as a tool row: pending (with its diff when it writes) -> permission ->
    in progress -> completed or failed. Never raises for the tool's own failure."""
    if call.name == DELEGATE and turn.can_delegate:
        return await _delegate(turn, call, row_id)
    # The session's mode now (it may have changed since the model was offered its tools).
    refusal = turn.tool_refusal(call.name)
    if refusal is not None:
        if call.name == UPDATE_PLAN:
            return ToolResult(content=f"error: {refusal}")
        row = _Row(turn, row_id, call.name)
        await row.update(ToolStatus.PENDING, raw_input={"arguments": (call.arguments or "")[:4096]})
        return await row.fail(refusal)
    if call.name == UPDATE_PLAN:
        # A plan is shown as a plan, not as a tool row; a call that cannot be one fails a row,
        # so the user sees the model tried.
        args = _parse_arguments(call.arguments)
        problem = args if isinstance(args, str) else await _update_plan(turn, args)
        if problem is None:
            return ToolResult(content="plan updated")
        row = _Row(turn, row_id, call.name)
        await row.update(ToolStatus.PENDING, raw_input={"arguments": (call.arguments or "")[:4096]})
        return await row.fail(problem)
    row = _Row(turn, row_id, call.name)
    args = _parse_arguments(call.arguments)
    if isinstance(args, str):
        shown = (call.arguments or "")[:4096]
        await row.update(ToolStatus.PENDING, raw_input={"arguments": shown})
        return await row.fail(args)
    raw_input: Any = args
    title = _title(call.name, args)
    row.title = title
    try:
        if call.name == READ_FILE:
            await row.update(ToolStatus.PENDING, raw_input=raw_input)
            return await _read_file(row, turn, args)
        if call.name in (WRITE_FILE, EDIT_FILE):
            return await _change_file(row, turn, call.name, args)
        if call.name == SHELL:
            await row.update(ToolStatus.PENDING, raw_input=raw_input)
            return await _shell(row, turn, args)
        if call.name in (SHELL_OUTPUT, SHELL_KILL):
            await row.update(ToolStatus.PENDING, raw_input=raw_input)
            return await _background_handle(row, turn, call.name, args)
        if call.name == EXTERNAL_MCP_TOOL and _external_available(turn):
            await row.update(ToolStatus.PENDING, raw_input=raw_input)
            return await _external(row, turn, args)
    except (FileToolError, ToolUnavailable) as exc:
        return await row.fail(str(exc))
    await row.update(ToolStatus.PENDING, raw_input=raw_input)
    return await row.fail(f"there is no tool named {call.name[:64]!r}")


class _Row:
    """The successive states of one tool row."""

    def __init__(self, turn: Turn, row_id: str, name: str) -> None:
        self.turn = turn
        self.row_id = row_id
        self.name = name
        self.title = name
        self.raw_input: Any = None
        self.locations: tuple[ToolLocation, ...] = ()
        self.diffs: tuple[FileDiff, ...] = ()

    async def update(self, status: ToolStatus, **fields: Any) -> None:
        if "raw_input" in fields:
            self.raw_input = fields.pop("raw_input")
        await self.turn.send_tool_row(
            self.row_id,
            ToolState(
                name=self.name,
                status=status,
                title=self.title,
                raw_input=self.raw_input,
                locations=self.locations,
                diffs=self.diffs,
                **fields,
            ),
        )

    async def ask(self) -> bool:
        request = ToolRequest(
            tool_id=self.row_id, name=self.name, title=self.title, raw_input=self.raw_input
        )
        allowed = await self.turn.ask_permission(request)
        # A cancelled run must not run the tool, even if the answer came in just before.
        await trio.lowlevel.checkpoint_if_cancelled()
        return allowed

    async def fail(self, text: str, raw_output: Any = None) -> ToolResult:
        await self.update(
            ToolStatus.FAILED, output_text=text[:MAX_ROW_TEXT_CHARS], raw_output=raw_output
        )
        return ToolResult(content=f"error: {text}")

    async def done(self, text: str, raw_output: Any = None) -> ToolResult:
        await self.update(
            ToolStatus.COMPLETED, output_text=text[:MAX_ROW_TEXT_CHARS], raw_output=raw_output
        )
        return ToolResult(content=text)


async def _delegate(turn: Turn, call: ToolCall, row_id: str) -> ToolResult:
    """A child session for the call's task; its answer (or why there is none) is the result."""
    row = _Row(turn, row_id, DELEGATE)
    args = _parse_arguments(call.arguments)
    if isinstance(args, str):
        await row.update(ToolStatus.PENDING, raw_input={"arguments": (call.arguments or "")[:4096]})
        return await row.fail(args)
    title, prompt = args.get("title"), args.get("prompt")
    row.title = title if isinstance(title, str) and title.strip() else DELEGATE
    await row.update(ToolStatus.IN_PROGRESS, raw_input=args)
    if not isinstance(prompt, str) or not prompt.strip():
        return await row.fail("delegate takes a title and a prompt")
    try:
        result = await turn.delegate(row_id, row.title, prompt)
    except ToolUnavailable as exc:
        return await row.fail(str(exc))
    if result.state is RunState.COMPLETED:
        return await row.done(result.text)
    return await row.fail(result.text)


async def _read_file(row: _Row, turn: Turn, args: Mapping[str, Any]) -> ToolResult:
    path = _string(args, "path")
    start = _positive(args, "start_line", 1)
    count = min(_positive(args, "max_lines", READ_LINES), READ_LINES)
    read = await read_text_async(turn.roots, path)
    lines = read.text.splitlines(keepends=True)
    window = lines[start - 1 : start - 1 + count]
    row.locations = (ToolLocation(path=read.path, line=start),)
    text = "".join(window)
    end = start - 1 + len(window)
    cut_mid_file = read.truncated and end >= len(lines)
    if cut_mid_file:
        # The read stopped mid-file, maybe inside a relay value: no start of one may be left.
        redactor = turn.tools.redactor
        text = redactor.without_partial_value(redactor.text(text))
    if start > 1 or end < len(lines):
        text += f"\n[lines {start}-{end} of {len(lines)}; pass start_line to read on]"
    if cut_mid_file:
        text += "\n[the file goes on past what a tool may read]"
    return await row.done(text)


async def _change_file(row: _Row, turn: Turn, name: str, args: Mapping[str, Any]) -> ToolResult:
    await row.update(ToolStatus.PENDING, raw_input=_shown_input(name, args))
    path = _string(args, "path")
    change = await _apply_change(turn, name, path, args, dry_run=True)
    row.locations = (change.location(),)
    row.diffs = (change.diff(),)
    await row.update(ToolStatus.PENDING)
    if not await row.ask():
        await row.fail("permission denied")
        return ToolResult(content=DENIED)
    await row.update(ToolStatus.IN_PROGRESS)
    # The file may have changed while the user decided: the applied change is the real one.
    change = await _apply_change(turn, name, path, args, dry_run=False)
    row.locations = (change.location(),)
    row.diffs = (change.diff(),)
    verb = "created" if change.old_text is None else "updated"
    return await row.done(f"{verb} {change.path}")


async def _apply_change(
    turn: Turn, name: str, path: str, args: Mapping[str, Any], *, dry_run: bool
) -> FileChange:
    # Through the session's tools: a real write meets the session's mode there.
    if name == WRITE_FILE:
        return await turn.tools.write_text(
            turn.roots, path, _string(args, "content"), dry_run=dry_run
        )
    return await turn.tools.edit_text(
        turn.roots, path, _string(args, "old_text"), _string(args, "new_text"), dry_run=dry_run
    )


async def _shell(row: _Row, turn: Turn, args: Mapping[str, Any]) -> ToolResult:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return await row.fail("no command given")
    if not await row.ask():
        await row.fail("permission denied")
        return ToolResult(content=DENIED)
    if args.get("background") is True:
        handle = await turn.start_background(
            row.row_id, command, title=row.title, raw_input=row.raw_input
        )
        return ToolResult(
            content=f"started {handle} in the background; read its output with shell_output "
            "and stop it with shell_kill"
        )
    await row.update(ToolStatus.IN_PROGRESS)
    try:
        result = await turn.run_shell(row.row_id, command)
    except (ToolUnavailable, OSError) as exc:
        return await row.fail(str(exc) or type(exc).__name__)
    raw = {"exitCode": result.exit_code, "output": result.output, "truncated": result.truncated}
    text = result.output + ("\n[output cut]" if result.truncated else "")
    for_model = f"exit code {result.exit_code}\n{text}"
    if result.exit_code == 0:
        await row.done(result.tail, raw_output=raw)
    else:
        await row.fail(shell_row_text(exit_line(result.exit_code), result.tail), raw_output=raw)
    return ToolResult(content=for_model)


async def _background_handle(
    row: _Row, turn: Turn, name: str, args: Mapping[str, Any]
) -> ToolResult:
    handle = _string(args, "handle")
    if name == SHELL_OUTPUT:
        return await row.done(turn.background_output(handle))
    return await row.done(turn.kill_background(handle))


async def _external(row: _Row, turn: Turn, args: Mapping[str, Any]) -> ToolResult:
    tool_id = args.get("tool")
    arguments = args.get("arguments", {})
    if not isinstance(tool_id, str) or not isinstance(arguments, dict):
        return await row.fail("external_mcp takes {tool: string, arguments: object}")
    if not await row.ask():
        await row.fail("permission denied")
        return ToolResult(content=DENIED)
    await row.update(ToolStatus.IN_PROGRESS)
    try:
        result = await turn.tools.call_external(tool_id, arguments, call_id=row.row_id)
    except trio.Cancelled:
        raise
    except Exception as exc:
        return await row.fail(str(exc)[:500] or type(exc).__name__)
    text = orjson.dumps(result).decode()
    return await row.done(text, raw_output=result)


async def _update_plan(turn: Turn, args: Mapping[str, Any]) -> str | None:
    """Send the plan the call gives; ``None`` when it was sent, else why it cannot be."""
    raw, markdown = args.get("entries"), args.get("markdown")
    if raw is not None and markdown is not None:
        return "give either entries or markdown, not both"
    if markdown is not None:
        if not isinstance(markdown, str):
            return "markdown must be a string"
        if len(markdown) > MAX_PLAN_MARKDOWN_CHARS:
            return f"markdown is longer than {MAX_PLAN_MARKDOWN_CHARS} characters"
        await turn.send_markdown_plan(markdown)
        return None
    if raw is None:
        return "give the plan as entries or as markdown"
    if not isinstance(raw, list) or len(raw) > MAX_PLAN_ENTRIES:
        return f"entries must be a list of at most {MAX_PLAN_ENTRIES}"
    entries = []
    for item in raw:
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, str) or not content.strip():
            return "every entry needs a non-blank content"
        try:
            status = PlanStatus(item.get("status", "pending"))
            priority = PlanPriority(item.get("priority", "medium"))
        except ValueError:
            return "unknown status or priority"
        entries.append(PlanEntry(content=content[:500], status=status, priority=priority))
    await turn.send_plan(entries)
    return None


def _external_available(turn: Turn) -> bool:
    return any(spec.name == EXTERNAL_MCP_TOOL for spec in turn.offered_tools)


def _parse_arguments(text: str | None) -> dict[str, Any] | str:
    """The arguments as an object, or why they cannot be used."""
    if text is None or len(text) > MAX_ARGUMENT_CHARS:
        return "the arguments are too long"
    if not text.strip():
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return "the arguments are not valid JSON"
    if not isinstance(value, dict):
        return "the arguments must be a JSON object"
    return value


def _string(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise FileToolError(f"{key} must be a string")
    return value


def _positive(args: Mapping[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FileToolError(f"{key} must be a whole number from 1")
    return value


def _title(name: str, args: Mapping[str, Any]) -> str:
    if name == SHELL and isinstance(args.get("command"), str):
        return f"shell: {args['command'][:200]}"
    if name in (SHELL_OUTPUT, SHELL_KILL) and isinstance(args.get("handle"), str):
        return f"{name}: {args['handle'][:64]}"
    if name in (READ_FILE, WRITE_FILE, EDIT_FILE) and isinstance(args.get("path"), str):
        return f"{name}: {args['path'][:200]}"
    if name == EXTERNAL_MCP_TOOL and isinstance(args.get("tool"), str):
        return f"external_mcp: {args['tool'][:64]}"
    return name[:64]


def _shown_input(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """A write's raw input without the whole content (the diff shows it)."""
    if name == WRITE_FILE:
        content = args.get("content")
        size = len(content) if isinstance(content, str) else 0
        return {"path": args.get("path"), "content_chars": size}
    return dict(args)
