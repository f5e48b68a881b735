"""Session modes: which tools a session's backend is offered, which of its calls ask the caller,
which run without asking, and which fail at once. The one place a mode's tool policy lives.

A tool call is judged by its ``ToolCategory``. The runtime knows the categories of the tools
the bundled backends share (``BUILTIN_TOOL_CATEGORIES``); a backend's own tool names its
category in its ``ToolRequest`` (a built-in name's category cannot be overridden), and an
unplaced tool is ``OTHER``, which the strict modes refuse (fail closed).

Four modes are built in (``BUILTIN_MODES``, default ``code``): ``ask`` (read-only), ``code``
(today's behaviour: the host's ``PermissionPolicy`` decides everything), ``plan`` (read-only plus
``update_plan``; the backend is told it is planning) and ``auto-edit`` (file writes and edits
inside the session's directories run without asking). A host may declare its own ``ModeSet``.

Resource handling, error handling, cancellation: plain values and pure functions; a bad
declaration is a ``ValueError`` when the ``ModeSet`` is made.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from maple_acp._text import one_line
from maple_acp.model import SessionMode, ToolCategory
from maple_acp.runtime._permissions import EXTERNAL_MCP_TOOL, ToolRequest

#: A mode id, as clients send it back: short and plain.
MAX_MODE_ID_CHARS = 64
#: Modes a host may declare: a client shows them all in one menu.
MAX_MODES = 32

#: The categories of the tools the bundled backends share. A request with one of these names
#: is judged by this category whatever category it claims.
BUILTIN_TOOL_CATEGORIES: Final[Mapping[str, ToolCategory]] = {
    "read_file": ToolCategory.READ,
    "write_file": ToolCategory.EDIT,
    "edit_file": ToolCategory.EDIT,
    "shell": ToolCategory.EXECUTE,
    # A background command's reading and stopping go with the shell that started it.
    "shell_output": ToolCategory.EXECUTE,
    "shell_kill": ToolCategory.EXECUTE,
    EXTERNAL_MCP_TOOL: ToolCategory.EXTERNAL,
    "update_plan": ToolCategory.PLAN,
}


class ModeDecision(enum.Enum):
    """What a mode makes of one tool call."""

    #: The call fails at once; nobody is asked.
    REFUSE = "refuse"
    #: The call runs without asking (neither the host's policy nor the caller is consulted).
    ALLOW = "allow"
    #: The host's ``PermissionPolicy`` decides, and the caller when it asks (today's path).
    POLICY = "policy"


def tool_category(name: str, claimed: ToolCategory | None = None) -> ToolCategory:
    """The category a call of ``name`` is judged by: the built-in one for a shared tool's name,
    else what the backend claimed, else ``OTHER``."""
    builtin = BUILTIN_TOOL_CATEGORIES.get(name)
    if builtin is not None:
        return builtin
    return claimed if claimed is not None else ToolCategory.OTHER


def inside_roots(path: object, roots: Sequence[str]) -> bool:
    """Whether ``path`` (relative to the first root, or absolute) names a place inside one of
    ``roots`` (canonical absolute directories), taken lexically: ``..`` may not climb out. The
    file tools refuse symlinks below a root, so a lexical answer is the one they act on."""
    if not isinstance(path, str) or not path or "\0" in path or not roots:
        return False
    candidate = os.path.normpath(os.path.join(roots[0], path))
    return any(
        candidate == root or candidate.startswith(root.rstrip(os.sep) + os.sep) for root in roots
    )


@attrs.frozen(kw_only=True)
class ToolPolicy:
    """What a mode lets a backend do, per tool category. A category not ``offered`` is refused
    without asking; an offered one goes to the host's policy unless it is ``unasked``."""

    #: Categories the backend is offered and may call.
    offered: frozenset[ToolCategory]
    #: Offered categories that run without asking.
    unasked: frozenset[ToolCategory] = frozenset()
    #: ``EDIT`` calls whose target path is inside the session's directories run without asking
    #: (one outside still goes to the host's policy).
    edits_inside_roots_unasked: bool = False
    #: The backend is told it is planning, not doing.
    planning: bool = False

    def __attrs_post_init__(self) -> None:
        for categories in (self.offered, self.unasked):
            if not all(isinstance(category, ToolCategory) for category in categories):
                raise ValueError("a tool policy names ToolCategory values")
        if not self.unasked <= self.offered:
            raise ValueError("a tool policy cannot run unasked what it does not offer")

    def allows(self, category: ToolCategory) -> bool:
        return category in self.offered

    def decide(
        self, category: ToolCategory, *, target: object, roots: Sequence[str]
    ) -> ModeDecision:
        """The decision on one call of ``category`` whose target path (for an edit) is
        ``target``."""
        if category not in self.offered:
            return ModeDecision.REFUSE
        if category in self.unasked:
            return ModeDecision.ALLOW
        if (
            category is ToolCategory.EDIT
            and self.edits_inside_roots_unasked
            and inside_roots(target, roots)
        ):
            return ModeDecision.ALLOW
        return ModeDecision.POLICY


@attrs.frozen(kw_only=True)
class ModeDeclaration:
    """One mode a host offers: how clients see it and the tool policy the runtime enforces."""

    mode: SessionMode
    policy: ToolPolicy

    def refusal(self, category: ToolCategory) -> str | None:
        """Why a call of ``category`` cannot run in this mode (one line), or ``None``."""
        if self.policy.allows(category):
            return None
        what = _CATEGORY_WORDS[category]
        return one_line(f"the session is in {self.mode.name} mode, which does not allow {what}")

    def decide(self, request: ToolRequest, roots: Sequence[str]) -> ModeDecision:
        category = tool_category(request.name, request.category)
        return self.policy.decide(category, target=_target_path(request.raw_input), roots=roots)


_CATEGORY_WORDS: Final[Mapping[ToolCategory, str]] = {
    ToolCategory.READ: "reading",
    ToolCategory.EDIT: "writing or editing files",
    ToolCategory.EXECUTE: "running commands",
    ToolCategory.EXTERNAL: "calling MCP tools",
    ToolCategory.PLAN: "plan updates",
    ToolCategory.OTHER: "tools it cannot place",
}


def _target_path(raw_input: Any) -> object:
    return raw_input.get("path") if isinstance(raw_input, Mapping) else None


_ALL = frozenset(ToolCategory)

ASK_MODE = ModeDeclaration(
    mode=SessionMode(
        id="ask", name="Ask", description="Read-only: answers questions, changes nothing"
    ),
    policy=ToolPolicy(offered=frozenset({ToolCategory.READ})),
)
CODE_MODE = ModeDeclaration(
    mode=SessionMode(
        id="code",
        name="Code",
        description="Reads freely; asks before writes, edits, commands and MCP tools",
    ),
    policy=ToolPolicy(offered=_ALL),
)
PLAN_MODE = ModeDeclaration(
    mode=SessionMode(
        id="plan", name="Plan", description="Read-only: works out a plan, changes nothing"
    ),
    policy=ToolPolicy(
        offered=frozenset({ToolCategory.READ, ToolCategory.PLAN}),
        unasked=frozenset({ToolCategory.PLAN}),
        planning=True,
    ),
)
AUTO_EDIT_MODE = ModeDeclaration(
    mode=SessionMode(
        id="auto-edit",
        name="Auto-edit",
        description="Edits files in the session's directories without asking; asks before "
        "commands and MCP tools",
    ),
    policy=ToolPolicy(offered=_ALL, edits_inside_roots_unasked=True),
)


class ModeSet:
    """The modes a host offers, in the order clients list them, and the default one. Raises
    ``ValueError`` for an empty set, a duplicate or malformed id, too many modes, or a default
    that is not among them."""

    def __init__(self, modes: Sequence[ModeDeclaration], *, default: str) -> None:
        declared = tuple(modes)
        if not declared:
            raise ValueError("a host declares at least one session mode")
        if len(declared) > MAX_MODES:
            raise ValueError(f"a host declares at most {MAX_MODES} session modes")
        by_id: dict[str, ModeDeclaration] = {}
        for declaration in declared:
            if not isinstance(declaration, ModeDeclaration):
                raise ValueError("session modes are ModeDeclaration values")
            mode_id = declaration.mode.id
            if (
                not isinstance(mode_id, str)
                or not mode_id
                or mode_id != mode_id.strip()
                or len(mode_id) > MAX_MODE_ID_CHARS
                or any(ord(char) < 32 for char in mode_id)
            ):
                raise ValueError(f"a session mode id is 1-{MAX_MODE_ID_CHARS} plain characters")
            if mode_id in by_id:
                raise ValueError(f"the session mode id {mode_id!r} is declared twice")
            by_id[mode_id] = declaration
        if default not in by_id:
            raise ValueError(f"the default session mode {default!r} is not declared")
        self._declared = declared
        self._by_id = by_id
        self.default = by_id[default]
        #: The modes as clients list them.
        self.modes: tuple[SessionMode, ...] = tuple(d.mode for d in declared)

    def get(self, mode_id: str | None) -> ModeDeclaration | None:
        return None if mode_id is None else self._by_id.get(mode_id)


#: The built-in modes: ``ask``, ``code`` (the default), ``plan``, ``auto-edit``.
BUILTIN_MODES = ModeSet((ASK_MODE, CODE_MODE, PLAN_MODE, AUTO_EDIT_MODE), default="code")
