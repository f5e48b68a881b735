"""What a turn offers the model besides the backend's own tools, and the bounds on what a
backend reports about its plan and its commands."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs

from maple_acp._text import CUT_TEXT, one_line, truncate
from maple_acp.model import CommandInfo, PlanEntry, ToolSpec
from maple_acp.runtime._tools import ExternalToolRouter

logger = logging.getLogger(__name__)

#: Entries of one plan: a plan is a short list of steps, not a document.
MAX_PLAN_ENTRIES = 256
#: Characters of one plan entry.
MAX_PLAN_ENTRY_CHARS = 2_000
#: Characters of a Markdown plan: as much as a whole checklist plan may hold in its first
#: 32 entries, enough for a page of steps and notes, not a document.
MAX_PLAN_MARKDOWN_CHARS = 64_000
#: Commands a backend may declare.
MAX_COMMANDS = 256
#: A command's name, and its one-line description or input hint.
MAX_COMMAND_NAME_CHARS = 64
MAX_COMMAND_TEXT_CHARS = 200


def external_mcp_spec(router: ExternalToolRouter) -> ToolSpec:
    """The ``external_mcp`` tool of a lease's router as a provider API takes a function: its
    name, description, and input schema (the exact tool ids as an enum, arguments an object)."""
    definition = router.tool_definition()
    return ToolSpec(
        name=definition.name,
        description=definition.description,
        input_schema=dict(definition.input_schema),
    )


def offered_tools(router: ExternalToolRouter | None) -> tuple[ToolSpec, ...]:
    """What a turn offers besides the backend's native tools. A router that cannot describe
    its tool offers nothing (the turn still runs; calls through it still work)."""
    if router is None:
        return ()
    try:
        return (external_mcp_spec(router),)
    except Exception:
        logger.warning("the external tool router did not describe its tool", exc_info=True)
        return ()


def bounded_plan(entries: Sequence[PlanEntry]) -> tuple[PlanEntry, ...]:
    plan: list[PlanEntry] = []
    for entry in list(entries)[:MAX_PLAN_ENTRIES]:
        if not isinstance(entry, PlanEntry):
            raise TypeError("a plan is a sequence of PlanEntry")
        content = truncate(entry.content, MAX_PLAN_ENTRY_CHARS, CUT_TEXT)
        plan.append(entry if content is entry.content else attrs.evolve(entry, content=content))
    return tuple(plan)


def bounded_markdown_plan(markdown: str) -> str:
    if not isinstance(markdown, str):
        raise TypeError("a Markdown plan is a str")
    if not markdown.strip():
        return ""  # nothing to show: a cleared plan, like an empty checklist
    return truncate(markdown, MAX_PLAN_MARKDOWN_CHARS, CUT_TEXT)


class CommandBounds:
    """Bounds a backend's declared commands for each new lease. A backend usually returns
    the same tuple every time, so the bounded form of the last one is reused (bounding walks
    every character, and session/new should not pay for it each time). CommandInfo is frozen:
    a tuple of them cannot change behind the cache's back."""

    def __init__(self) -> None:
        self._declared: object = None
        self._bounded: tuple[CommandInfo, ...] = ()

    def of(self, commands: Sequence[CommandInfo]) -> tuple[CommandInfo, ...]:
        if isinstance(commands, tuple) and commands is self._declared:
            return self._bounded
        bounded = bounded_commands(commands)
        if isinstance(commands, tuple):
            self._declared, self._bounded = commands, bounded
        return bounded


def bounded_commands(commands: Sequence[CommandInfo]) -> tuple[CommandInfo, ...]:
    bounded: list[CommandInfo] = []
    for command in list(commands)[:MAX_COMMANDS]:
        if not isinstance(command, CommandInfo):
            raise TypeError("commands are a sequence of CommandInfo")
        hint = command.input_hint
        bounded.append(
            CommandInfo(
                name=_line(command.name, MAX_COMMAND_NAME_CHARS),
                description=_line(command.description, MAX_COMMAND_TEXT_CHARS),
                input_hint=_line(hint, MAX_COMMAND_TEXT_CHARS) if hint is not None else None,
            )
        )
    return tuple(bounded)


def _line(text: str, limit: int) -> str:
    # one_line stands in "error" for empty text; an empty description stays empty.
    return one_line(text, limit) if text.strip() else ""
