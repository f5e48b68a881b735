"""The demo's delegation: what ``/delegate TITLE :: PROMPT`` does in the parent's turn, and
the scripted child that answers it, so that every rule about child sessions can be seen and
tested without a model."""

from __future__ import annotations

from maple_acp.backends import _demo_tools
from maple_acp.runtime import (
    DelegationResult,
    RunState,
    ToolState,
    ToolStatus,
    ToolUnavailable,
    Turn,
    TurnFailed,
)

#: What the scripted child runs through its own permission question.
CHILD_COMMAND = "echo child"
#: Where ``/delegate``'s title ends and its prompt begins.
SEPARATOR = "::"


async def delegate(turn: Turn, rest: str) -> None:
    """``/delegate TITLE :: PROMPT``: one ``delegate`` tool row whose result is the child's
    answer (or why there is none)."""
    title, separator, prompt = rest.partition(SEPARATOR)
    if not separator or not prompt.strip():
        raise TurnFailed("/delegate takes TITLE :: PROMPT")
    title, prompt = title.strip(), prompt.strip()
    tool_id = f"{turn.run_id}-delegate-{turn.new_message_id()}"
    raw_input = {"title": title, "prompt": prompt}

    async def row(status: ToolStatus, text: str | None = None) -> None:
        state = ToolState(
            name="delegate", status=status, title=title, raw_input=raw_input, output_text=text
        )
        await turn.send_tool_row(tool_id, state)

    await row(ToolStatus.IN_PROGRESS)
    try:
        result: DelegationResult = await turn.delegate(tool_id, title, prompt)
    except ToolUnavailable as exc:
        await row(ToolStatus.FAILED, str(exc))
        return
    completed = result.state is RunState.COMPLETED
    await row(ToolStatus.COMPLETED if completed else ToolStatus.FAILED, result.text)


async def scripted_child(turn: Turn) -> None:
    """A child session's turn whose prompt is not a script: it streams what it works on,
    runs ``echo child`` through its own permission question, then answers in a message of
    its own (its parent's tool result)."""
    message_id = turn.new_message_id()
    await turn.send_text("working on: ", message_id=message_id)
    await turn.send_text(turn.prompt, message_id=message_id)
    await _demo_tools.shell(turn, {"command": CHILD_COMMAND})
    await turn.send_text(f"answer: {turn.prompt}", message_id=turn.new_message_id())
