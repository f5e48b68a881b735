"""What the model is told of its plan when the run that wrote it is not sent again: the latest
plan, a Markdown one as written, and nothing once it was cleared."""

from __future__ import annotations

from types import SimpleNamespace

from maple_acp.backends.provider._shell import ProviderEngine
from maple_acp.model import ItemKind, PlanEntry, TimelineItem

TOLD = "Your plan so far (update it with update_plan):\n"
MARKDOWN = "# Fix it\n\n- read the code\n- **fix** it"


def plan_row(item_id: str, *entries: PlanEntry, markdown: str = "") -> TimelineItem:
    return TimelineItem(
        item_id=item_id,
        kind=ItemKind.PLAN,
        created_ms=1,
        run_id=item_id,
        plan=entries,
        text=markdown,
    )


def told(*history: TimelineItem) -> str:
    # The prompt reads only the engine's configured prompt and the turn's root, skills and mode.
    engine = SimpleNamespace(_config=SimpleNamespace(system_prompt="You help."))
    turn = SimpleNamespace(root="/p", skills=(), planning=False)
    system: str = ProviderEngine.system_prompt(engine, turn, list(history), set())  # type: ignore[arg-type]
    return system


def test_a_markdown_plan_is_told_as_written() -> None:
    system = told(plan_row("r1", PlanEntry(content="old")), plan_row("r2", markdown=MARKDOWN))
    assert system == f"You help.\n\n{TOLD}{MARKDOWN}"


def test_a_cleared_plan_is_no_plan() -> None:
    assert TOLD not in told(plan_row("r1", PlanEntry(content="old")), plan_row("r2"))
    assert told(plan_row("r1", PlanEntry(content="step"))) == f"You help.\n\n{TOLD}- [pending] step"
