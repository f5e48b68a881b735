"""The demo's native tools: what ``/tool shell``, ``/bg``, ``/tool write_file`` and ``/mcp``
do, each through its own permission and the session's mode, on rows a client shows."""

from __future__ import annotations

from typing import Any

import orjson

from maple_acp.runtime import (
    EXTERNAL_MCP_TOOL,
    FileChange,
    FileDiff,
    FileToolError,
    ShellResult,
    ToolLocation,
    ToolRequest,
    ToolState,
    ToolStatus,
    ToolUnavailable,
    Turn,
    exit_line,
    shell_row_text,
)

#: Tool output text shown in a row; the raw output keeps the rest (already bounded by the tool).
MAX_TOOL_TEXT_CHARS = 16_000


async def shell(turn: Turn, args: dict[str, Any]) -> None:
    command = args.get("command")
    background = args.get("background") is True
    tool_id = f"{turn.run_id}-shell-{turn.new_message_id()}"
    title = f"shell: {command}" if isinstance(command, str) else "shell"
    raw_input = {"command": command, **({"background": True} if background else {})}
    row = _Row(turn, tool_id, "shell", title)
    await row.send(ToolStatus.PENDING, raw_input=raw_input)
    if await row.refused():
        return
    if not isinstance(command, str) or not command:
        await row.send(ToolStatus.FAILED, "no command given")
        return
    request = ToolRequest(tool_id=tool_id, name="shell", title=title, raw_input=raw_input)
    if not await turn.ask_permission(request):
        return await row.send(ToolStatus.FAILED, "permission denied")
    if background:
        try:
            handle = await turn.start_background(tool_id, command, title=title, raw_input=raw_input)
        except ToolUnavailable as exc:
            await row.send(ToolStatus.FAILED, str(exc))
            return
        await turn.send_text(f"started {handle}", message_id=turn.new_message_id())
        return
    await row.send(ToolStatus.IN_PROGRESS)
    try:
        result = await turn.run_shell(tool_id, command)
    except (ToolUnavailable, OSError) as exc:
        await row.send(ToolStatus.FAILED, str(exc))
        return
    succeeded = result.exit_code == 0
    await row.send(
        ToolStatus.COMPLETED if succeeded else ToolStatus.FAILED,
        result.tail if succeeded else shell_row_text(exit_line(result.exit_code), result.tail),
        raw_output=_shell_raw(result),
    )


async def write_file(turn: Turn, args: dict[str, Any]) -> None:
    path, content = args.get("path"), args.get("content")
    tool_id = f"{turn.run_id}-write_file-{turn.new_message_id()}"
    title = f"write_file: {path}" if isinstance(path, str) else "write_file"
    raw_input = {"path": path, "content": content}
    row = _Row(turn, tool_id, "write_file", title)
    await row.send(ToolStatus.PENDING, raw_input=raw_input)
    if await row.refused():
        return
    if not isinstance(path, str) or not path or not isinstance(content, str):
        await row.send(ToolStatus.FAILED, "write_file takes a string path and content")
        return
    try:
        preview = await _preview_write(turn, path, content)
    except FileToolError as exc:
        await row.send(ToolStatus.FAILED, str(exc))
        return
    row.locations = (preview.location(),)
    await row.send(ToolStatus.PENDING, raw_input=raw_input, diffs=(preview.diff(),))
    request = ToolRequest(tool_id=tool_id, name="write_file", title=title, raw_input=raw_input)
    if not await turn.ask_permission(request):
        await row.send(ToolStatus.FAILED, "permission denied")
        return
    await row.send(ToolStatus.IN_PROGRESS, diffs=(preview.diff(),))
    try:
        change = await turn.tools.write_text(turn.roots, path, content)
    except (FileToolError, ToolUnavailable) as exc:
        await row.send(ToolStatus.FAILED, str(exc))
        return
    row.locations = (change.location(),)
    await row.send(
        ToolStatus.COMPLETED,
        f"wrote {len(content)} characters to {change.path}",
        diffs=(change.diff(),),
    )


async def external(turn: Turn, tool_id: str, arguments: dict[str, Any]) -> None:
    call_id = f"{turn.run_id}-mcp-{turn.new_message_id()}"
    title = f"external_mcp: {tool_id}"
    raw_input = {"tool": tool_id, "arguments": arguments}
    row = _Row(turn, call_id, EXTERNAL_MCP_TOOL, title)
    await row.send(ToolStatus.PENDING, raw_input=raw_input)
    if await row.refused():
        return
    request = ToolRequest(tool_id=call_id, name=EXTERNAL_MCP_TOOL, title=title, raw_input=raw_input)
    if not await turn.ask_permission(request):
        await row.send(ToolStatus.FAILED, "permission denied")
        return
    try:
        result = await turn.tools.call_external(tool_id, arguments, call_id=call_id)
    except Exception as exc:
        await row.send(ToolStatus.FAILED, str(exc) or type(exc).__name__)
        return
    text = orjson.dumps(result).decode()
    await row.send(ToolStatus.COMPLETED, text, raw_output=result)


class _Row:
    """One tool call's rows: the name, title and locations stay; each row states the rest."""

    def __init__(self, turn: Turn, tool_id: str, name: str, title: str) -> None:
        self.turn = turn
        self.tool_id = tool_id
        self.name = name
        self.title = title
        self.locations: tuple[ToolLocation, ...] = ()

    async def refused(self) -> bool:
        """End the row as failed if the session's mode forbids the tool now."""
        refusal = self.turn.tool_refusal(self.name)
        if refusal is None:
            return False
        await self.send(ToolStatus.FAILED, refusal)
        return True

    async def send(
        self,
        status: ToolStatus,
        text: str | None = None,
        *,
        raw_input: Any = None,
        raw_output: Any = None,
        diffs: tuple[FileDiff, ...] = (),
    ) -> None:
        await self.turn.send_tool_row(
            self.tool_id,
            ToolState(
                name=self.name,
                status=status,
                title=self.title,
                raw_input=raw_input,
                raw_output=raw_output,
                output_text=None if text is None else text[:MAX_TOOL_TEXT_CHARS],
                locations=self.locations,
                diffs=diffs,
            ),
        )


async def _preview_write(turn: Turn, path: str, content: str) -> FileChange:
    """What writing ``content`` to ``path`` would change, without writing: shown to the
    caller while it decides. Raises ``FileToolError`` for a path outside the session's
    directories."""
    # A dry run reads the old text through the same fd walk as the write, never by a path
    # string that a swapped directory could send elsewhere.
    planned = await turn.tools.write_text(turn.roots, path, content, dry_run=True)
    return FileChange(path=planned.path, old_text=planned.old_text, new_text=content)


def _shell_raw(result: ShellResult) -> dict[str, Any]:
    return {"exitCode": result.exit_code, "output": result.output, "truncated": result.truncated}
