"""Runtime events and stored history as ``session/update`` params (sans-I/O).

One :class:`SessionProjector` per session keeps the only state projection needs: which tool
ids were already announced, so the first row of a tool id becomes ``tool_call`` and every
later row ``tool_call_update`` — for live runs and history replay alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

from maple_acp.edge._bounds import (
    MAX_TOOL_TEXT_CHARS,
    absolute_locations,
    bound_raw,
    bound_text,
    infer_tool_kind,
)
from maple_acp.runtime import (
    GoalRecord,
    ItemKind,
    ModelChoices,
    TimelineItem,
    ToolState,
    ToolStatus,
)
from maple_acp.wire import (
    GOAL_CONTROL_METHOD,
    ChunkKind,
    SessionConfigOption,
    SessionConfigSelect,
    SessionConfigSelectOption,
    SessionMode,
    SessionModeState,
    text_chunk_update,
    unstructure,
)

#: The one session mode: every undecided tool request goes to the caller.
MODE_ID: Final = "interactive"
MODEL_OPTION_ID: Final = "model"
MODE_OPTION_ID: Final = "mode"

_STATUS: Final = {
    ToolStatus.PENDING: "pending",
    ToolStatus.IN_PROGRESS: "in_progress",
    ToolStatus.COMPLETED: "completed",
    ToolStatus.FAILED: "failed",
    # ACP has no "cancelled" tool status; a cancelled call did not complete.
    ToolStatus.CANCELLED: "failed",
}
_CHUNK_KIND: Final[dict[ItemKind, ChunkKind]] = {
    ItemKind.USER: "user_message_chunk",
    ItemKind.ASSISTANT: "agent_message_chunk",
    ItemKind.THOUGHT: "agent_thought_chunk",
}


def _pieces(text: str) -> Iterator[str]:
    """Long text as consecutive pieces of at most :data:`MAX_TOOL_TEXT_CHARS` characters.

    Message text is split rather than cut: every piece goes out under the same message id, so
    the client sees the whole message while no single frame carries more than the bound."""
    if len(text) <= MAX_TOOL_TEXT_CHARS:
        yield text
        return
    for start in range(0, len(text), MAX_TOOL_TEXT_CHARS):
        yield text[start : start + MAX_TOOL_TEXT_CHARS]


def mode_state() -> SessionModeState:
    return SessionModeState(
        current_mode_id=MODE_ID,
        available_modes=(
            SessionMode(
                id=MODE_ID,
                name="Interactive",
                description="Tool requests the host does not allow on its own ask you first.",
            ),
        ),
    )


def config_options(choices: ModelChoices, current_model: str, *, locked: bool) -> list[Any]:
    """The session's config options: ``model`` (all choices, or only the locked model once
    the task has history) and ``mode`` (the one interactive mode)."""
    if locked:
        models = [m for m in choices.models if m.id == current_model]
        if not models:
            models_out = [SessionConfigSelectOption(value=current_model, name=current_model)]
        else:
            models_out = [SessionConfigSelectOption(value=m.id, name=m.name) for m in models]
    else:
        models_out = [
            SessionConfigSelectOption(value=m.id, name=m.name, description=m.description or None)
            for m in choices.models
        ]
    options: list[SessionConfigOption] = [
        SessionConfigSelect(
            id=MODEL_OPTION_ID,
            name="Model",
            category="model",
            current_value=current_model,
            options=tuple(models_out),
            description="Locked once the session has history." if locked else None,
        ),
        SessionConfigSelect(
            id=MODE_OPTION_ID,
            name="Mode",
            category="mode",
            current_value=MODE_ID,
            options=(SessionConfigSelectOption(value=MODE_ID, name="Interactive"),),
        ),
    ]
    return [unstructure(option, as_type=SessionConfigOption) for option in options]


def goal_snapshot(goal: GoalRecord) -> dict[str, Any]:
    """The goal extension's snapshot of a stored goal (Unix ms timestamps)."""
    snapshot: dict[str, Any] = {
        "objective": goal.objective,
        "status": goal.status.value,
        "iterations": goal.iterations,
        "createdAt": goal.created_ms,
        "updatedAt": goal.updated_ms,
        "controlMethod": GOAL_CONTROL_METHOD,
    }
    if goal.last_reason is not None:
        snapshot["lastReason"] = bound_text(goal.last_reason, 500)
    budgets: dict[str, Any] = {}
    if goal.token_budget is not None:
        budgets["tokenBudget"] = goal.token_budget
    if goal.tokens_used is not None:
        budgets["tokensUsed"] = goal.tokens_used
    if budgets:
        snapshot["budgets"] = budgets
    return snapshot


class SessionProjector:
    """Builds the params of every ``session/update`` for one session."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._announced: set[str] = set()

    def _params(self, update: dict[str, Any]) -> dict[str, Any]:
        return {"sessionId": self.session_id, "update": update}

    def text(self, kind: ChunkKind, message_id: str, text: str) -> list[dict[str, Any]]:
        return [
            text_chunk_update(self.session_id, kind, message_id, piece) for piece in _pieces(text)
        ]

    def tool(
        self, tool_id: str, tool: ToolState, *, summary: str = "", announce: bool = True
    ) -> dict[str, Any]:
        """``tool_call`` for the first row of ``tool_id``, ``tool_call_update`` after it.

        The visible text is the terminal output when there is one, else the request summary;
        raw input and output are bounded (:func:`bound_raw`). ``announce=False`` builds the
        shape without counting it as sent (a permission request's tool call)."""
        first = tool_id not in self._announced
        if announce:
            self._announced.add(tool_id)
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call" if first else "tool_call_update",
            "toolCallId": tool_id,
            "title": bound_text(tool.title or summary or tool.name, 500),
            "kind": infer_tool_kind(tool.name),
            "status": _STATUS[tool.status],
        }
        text = tool.output_text if tool.output_text is not None else summary
        if text:
            update["content"] = [
                {"type": "content", "content": {"type": "text", "text": bound_text(text)}}
            ]
        locations = absolute_locations([loc.path for loc in tool.locations])
        if locations:
            update["locations"] = locations
        if tool.raw_input is not None:
            update["rawInput"] = bound_raw(tool.raw_input)
        if tool.raw_output is not None:
            update["rawOutput"] = bound_raw(tool.raw_output)
        return self._params(update)

    def notice(self, message_id: str, text: str) -> list[dict[str, Any]]:
        """A notice about the run (overflow, failure) as visible agent text."""
        return self.text("agent_message_chunk", message_id, bound_text(text, 500))

    def title(self, title: str) -> dict[str, Any]:
        return self._params(
            {"sessionUpdate": "session_info_update", "title": bound_text(title, 500)}
        )

    def goal(self, goal: GoalRecord | None) -> dict[str, Any]:
        snapshot = None if goal is None else goal_snapshot(goal)
        return self._params({"sessionUpdate": "session_info_update", "_meta": {"goal": snapshot}})

    def config_update(self, options: list[Any]) -> dict[str, Any]:
        return self._params({"sessionUpdate": "config_option_update", "configOptions": options})

    def history(self, items: Sequence[TimelineItem]) -> Iterator[dict[str, Any]]:
        """Replay of stored history through the same rules as live events."""
        for item in items:
            if item.kind is ItemKind.TOOL:
                if item.tool is not None:
                    yield self.tool(item.item_id, item.tool, summary=item.text)
            elif item.text:
                yield from self.text(_CHUNK_KIND[item.kind], item.item_id, item.text)
