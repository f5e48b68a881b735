"""What a backend receives (history so far, offered tools) and what it may report beyond text
and tool rows: plans, context usage, commands, diffs and locations, titles."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from runtime_helpers import LoopRouter, of_type

from maple_acp._text import CUT_DIFF
from maple_acp.model import (
    CommandInfo,
    FileDiff,
    ItemKind,
    PlanEntry,
    PlanStatus,
    TimelineItem,
    ToolLocation,
    ToolSpec,
    ToolState,
    ToolStatus,
)
from maple_acp.runtime import (
    EXTERNAL_MCP_TOOL,
    AgentService,
    CommandsChanged,
    ContextUsage,
    PlanUpdated,
    RunEnded,
    RunEvent,
    SessionLease,
    StopReason,
    TitleChanged,
    ToolRow,
    Turn,
    TurnFailed,
    TurnResult,
)
from maple_acp.runtime._tool_rows import MAX_DIFF_SIDE_CHARS
from maple_acp.testing.demo import demo_service, run_prompt

COMMANDS = (CommandInfo(name="ask", description="Ask a question", input_hint="question"),)


class ScriptedEngine:
    """A small engine of its own: each prompt line is one action; it records what it got."""

    def __init__(self) -> None:
        self.histories: list[tuple[TimelineItem, ...]] = []
        self.offered: list[tuple[ToolSpec, ...]] = []

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return COMMANDS

    async def run_turn(self, turn: Turn) -> TurnResult:
        self.histories.append(turn.history)
        stop = StopReason.END_TURN
        self.offered.append(turn.offered_tools)
        for line in turn.prompt.splitlines():
            word, _, rest = line.partition(" ")
            if word == "plan":
                await turn.send_plan(
                    [
                        PlanEntry(content=step, status=PlanStatus.COMPLETED)
                        if step.startswith("done:")
                        else PlanEntry(content=step)
                        for step in rest.split(";")
                    ]
                )
            elif word == "context":
                used, size = (int(part) for part in rest.split())
                try:
                    await turn.report_context(used, size)
                except ValueError as exc:
                    raise TurnFailed(str(exc)) from exc
            elif word == "commands":
                await turn.set_commands(
                    [CommandInfo(name=name, description=f"run {name}") for name in rest.split()]
                )
            elif word == "stop":
                stop = StopReason(rest)
            elif word == "title":
                await turn.set_title(rest)
            elif word == "edit":
                await turn.send_tool_row(
                    "edit-1",
                    ToolState(
                        name="edit_file",
                        status=ToolStatus.COMPLETED,
                        title="edit",
                        output_text="edited",
                        locations=(ToolLocation(path="/srv/project/a.txt", line=2),),
                        diffs=(
                            FileDiff(path="/srv/project/a.txt", new_text="new", old_text="old"),
                            FileDiff(path="/srv/project/big.txt", new_text="z" * (70 * 1024)),
                        ),
                    ),
                )
            else:
                await turn.send_text(f"said: {line}")
        return TurnResult(stop_reason=stop)


class Silent:
    """An engine without ``available_commands``."""

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text("ok")


@pytest.fixture
async def engine_service(tmp_path: Path) -> AsyncIterator[tuple[AgentService, ScriptedEngine]]:
    engine = ScriptedEngine()
    data = tmp_path / "data"
    data.mkdir()
    async with demo_service(data, backend=engine) as service:
        yield service, engine


async def new_lease(
    nursery: trio.Nursery, service: AgentService, cwd: Path, **kw: Any
) -> SessionLease:
    lease: SessionLease = await nursery.start(
        lambda task_status: service.serve_new_task(str(cwd), task_status=task_status, **kw)
    )
    return lease


async def test_history_is_what_came_before_this_turn(
    engine_service: tuple[AgentService, ScriptedEngine], project: Path
) -> None:
    service, engine = engine_service
    async with trio.open_nursery() as nursery:
        lease = await new_lease(nursery, service, project)
        await run_prompt(lease, "hello\nplan one;done:two\nedit")
        await run_prompt(lease, "again")
        await lease.release(close=True)
    first, second = engine.histories
    assert first == ()
    kinds = [item.kind for item in second]
    assert kinds == [ItemKind.USER, ItemKind.ASSISTANT, ItemKind.PLAN, ItemKind.TOOL]
    assert second[0].text == "hello\nplan one;done:two\nedit"
    assert second[1].text == "said: hello"
    assert second[2].plan == (
        PlanEntry(content="one"),
        PlanEntry(content="done:two", status=PlanStatus.COMPLETED),
    )
    tool = second[3].tool
    assert tool is not None
    assert tool.status is ToolStatus.COMPLETED
    # This turn's own user message is not part of "so far".
    assert all(item.text != "again" for item in second)


async def test_offered_tools_hold_external_mcp_only_with_a_router(
    engine_service: tuple[AgentService, ScriptedEngine], project: Path
) -> None:
    service, engine = engine_service
    router = LoopRouter("servers")

    async def factory(nursery: trio.Nursery, task_id: str) -> LoopRouter:
        await nursery.start(router.serve)
        return router

    async with trio.open_nursery() as nursery:
        plain = await new_lease(nursery, service, project)
        await run_prompt(plain, "x")
        await plain.release(close=True)
        routed = await new_lease(nursery, service, project, router_factory=factory)
        await run_prompt(routed, "y")
        await routed.replace_router(None)
        await run_prompt(routed, "z")
        await routed.release(close=True)
    assert engine.offered[0] == ()
    [spec] = engine.offered[1]
    assert spec.name == EXTERNAL_MCP_TOOL
    assert spec.input_schema["type"] == "object"
    assert engine.offered[2] == ()


async def test_plan_context_and_commands_reach_the_caller(
    engine_service: tuple[AgentService, ScriptedEngine], project: Path
) -> None:
    service, _engine = engine_service
    async with trio.open_nursery() as nursery:
        lease = await new_lease(nursery, service, project)
        assert lease.commands == COMMANDS
        events, outcome = await run_prompt(
            lease, "plan a;b\ncontext 900 800\nplan done:a;done:b\ncommands build test"
        )
        assert outcome.state.value == "completed"
        plans = [event.entries for event in of_type(events, PlanUpdated)]
        assert plans == [
            (PlanEntry(content="a"), PlanEntry(content="b")),
            (
                PlanEntry(content="done:a", status=PlanStatus.COMPLETED),
                PlanEntry(content="done:b", status=PlanStatus.COMPLETED),
            ),
        ]
        [context] = of_type(events, ContextUsage)
        assert (context.used, context.size) == (900, 800)
        [changed] = of_type(events, CommandsChanged)
        assert [c.name for c in changed.commands] == ["build", "test"]
        assert lease.commands == changed.commands
        # Both plans are history; the latest is the one a replay shows.
        stored = [item for item in await lease.history() if item.kind is ItemKind.PLAN]
        assert stored[-1].plan == plans[-1]
        # Context usage is two integers >= 0.
        _events, outcome = await run_prompt(lease, "context -1 5")
        assert outcome.state.value == "failed"
        await lease.release(close=True)


async def test_a_backend_without_commands_offers_none(tmp_path: Path, project: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    async with demo_service(data, backend=Silent()) as service, trio.open_nursery() as nursery:
        lease = await new_lease(nursery, service, project)
        assert lease.commands == ()
        await lease.release(close=True)


async def test_diffs_and_locations_flow_through_bounded(
    engine_service: tuple[AgentService, ScriptedEngine], project: Path
) -> None:
    service, _engine = engine_service
    async with trio.open_nursery() as nursery:
        lease = await new_lease(nursery, service, project)
        events, _outcome = await run_prompt(lease, "edit")
        [row] = of_type(events, ToolRow)
        history = await lease.history()
        await lease.release(close=True)
    small, big = row.tool.diffs
    assert small == FileDiff(path="/srv/project/a.txt", new_text="new", old_text="old")
    assert big.truncated
    assert len(big.new_text) == MAX_DIFF_SIDE_CHARS
    assert big.new_text.endswith(CUT_DIFF)
    assert row.tool.locations == (ToolLocation(path="/srv/project/a.txt", line=2),)
    [stored] = [item.tool for item in history if item.kind is ItemKind.TOOL]
    assert stored is not None
    assert stored.diffs == row.tool.diffs
    assert stored.locations == row.tool.locations


def titles(events: list[RunEvent]) -> list[str]:
    return [event.title for event in of_type(events, TitleChanged)]


async def test_an_untitled_task_is_titled_from_its_first_message(
    engine_service: tuple[AgentService, ScriptedEngine], project: Path
) -> None:
    service, _engine = engine_service
    first_line = "Fix the flaky upload test " + "and more words " * 10
    async with trio.open_nursery() as nursery:
        lease = await new_lease(nursery, service, project)
        events, _ = await run_prompt(lease, f"   \n\t{first_line}\nsecond line")
        [title] = titles(events)
        assert title.startswith("Fix the flaky upload test")
        assert len(title) <= 80
        assert "\n" not in title
        # It comes before the end of the run, and only once.
        assert isinstance(events[-1], RunEnded)
        assert events.index(of_type(events, TitleChanged)[0]) < len(events) - 1
        events, _ = await run_prompt(lease, "something else")
        assert titles(events) == []
        task_id = lease.task_id
        await lease.release(close=True)
        listed = {task.id: task.title for task in (await service.list_tasks()).tasks}
        assert listed[task_id] == title
        # A backend's own title wins.
        lease = await new_lease(nursery, service, project)
        events, _ = await run_prompt(lease, "title Chosen by the engine\nhello")
        assert titles(events) == ["Chosen by the engine"]
        assert lease.task.title == "Chosen by the engine"
        await lease.release(close=True)


async def test_a_backend_says_why_its_turn_stopped(
    engine_service: tuple[AgentService, ScriptedEngine], project: Path
) -> None:
    service, _engine = engine_service
    async with trio.open_nursery() as nursery:
        lease = await new_lease(nursery, service, project)
        reasons = []
        for script in ("hello", "stop max_tokens", "stop refusal", "stop max_turn_requests"):
            _events, outcome = await run_prompt(lease, script)
            reasons.append(outcome.stop_reason)
        # A failed turn's stop reason is not the backend's to give.
        _events, failed = await run_prompt(lease, "stop refusal\ncontext -1 1")
        await lease.release(close=True)
    assert reasons == [
        StopReason.END_TURN,
        StopReason.MAX_TOKENS,
        StopReason.REFUSAL,
        StopReason.MAX_TURN_REQUESTS,
    ]
    assert failed.state.value == "failed"
    assert failed.stop_reason is StopReason.END_TURN


class WrongResult:
    """Returns something that is not a ``TurnResult``."""

    def __init__(self, returned: object) -> None:
        self.returned = returned

    async def run_turn(self, turn: Turn) -> Any:
        await turn.send_text("done")
        return self.returned


@pytest.mark.parametrize(
    "returned",
    [True, "end_turn", StopReason.REFUSAL, TurnResult(stop_reason="refusal")],  # type: ignore[arg-type]
)
async def test_a_result_that_is_not_a_turn_result_fails_the_run(
    tmp_path: Path, project: Path, returned: object
) -> None:
    # Fail closed: a backend returning the wrong thing must not pass for a finished answer.
    data = tmp_path / "data"
    data.mkdir()
    backend = WrongResult(returned)
    async with demo_service(data, backend=backend) as service, trio.open_nursery() as nursery:
        lease = await new_lease(nursery, service, project)
        _events, outcome = await run_prompt(lease, "go")
        await lease.release(close=True)
    assert outcome.state.value == "failed"
    assert outcome.failure


async def test_every_lease_starts_with_the_declared_commands(
    engine_service: tuple[AgentService, ScriptedEngine], project: Path
) -> None:
    service, _engine = engine_service
    async with trio.open_nursery() as nursery:
        first = await new_lease(nursery, service, project)
        await run_prompt(first, "commands only")
        assert [c.name for c in first.commands] == ["only"]
        # A turn's change is that lease's; the next lease starts from the declaration.
        second = await new_lease(nursery, service, project)
        assert second.commands == COMMANDS
        await first.release(close=True)
        await second.release(close=True)


class SkillReader:
    """Records the skills each turn sees."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    async def run_turn(self, turn: Turn) -> None:
        self.seen.append(tuple(skill.name for skill in turn.skills))
        await turn.send_text("ok")


async def test_a_new_task_in_a_trusted_project_sees_its_skills(
    tmp_path: Path, project: Path
) -> None:
    skill = project / ".agents" / "skills" / "deploy" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# deploy\n")
    data = tmp_path / "data"
    data.mkdir()
    reader = SkillReader()
    async with demo_service(data, backend=reader) as service, trio.open_nursery() as nursery:
        # Untrusted: no skills. (The trust question is the caller's; this host asks none.)
        lease = await new_lease(nursery, service, project)
        await run_prompt(lease, "first")
        await lease.release(close=True)
        await service.set_project_trust(str(project), True)
        # A task created after the decision sees them from its first turn on, without a
        # trust question (none is needed).
        lease = await new_lease(nursery, service, project)
        assert lease.skills == ()
        await run_prompt(lease, "second")
        assert [s.name for s in lease.skills] == ["deploy"]
        await lease.release(close=True)
    assert reader.seen == [(), ("deploy",)]
