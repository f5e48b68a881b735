"""Session modes and thinking effort: what each mode offers and decides, enforced by the
runtime (never left to the backend), stored with the task and restored on load; through a real
SQLite store and the demo backend or small engines of the tests' own."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from runtime_helpers import LoopRouter

from maple_acp.backends.demo import demo_catalog, demo_policy
from maple_acp.model import SessionMode, ToolCategory
from maple_acp.runtime import (
    BUILTIN_MODES,
    CODE_MODE,
    AgentService,
    ModeChanged,
    ModeDeclaration,
    ModeSet,
    PermissionRequest,
    RejectionKind,
    RunEvent,
    RunOutcome,
    RunState,
    RuntimeRejection,
    SessionLease,
    ToolPolicy,
    ToolRequest,
    ToolRow,
    ToolStatus,
    ToolUnavailable,
    Turn,
)
from maple_acp.testing.demo import demo_service, make_demo_service
from maple_acp.testing.store import temp_store

SHARED_TOOLS = ("read_file", "write_file", "edit_file", "shell", "external_mcp", "update_plan")


async def open_lease(
    service: AgentService, nursery: trio.Nursery, cwd: Path, **kwargs: Any
) -> SessionLease:
    lease: SessionLease = await nursery.start(
        lambda task_status: service.serve_new_task(str(cwd), task_status=task_status, **kwargs)
    )
    return lease


async def drive(
    lease: SessionLease, prompt: str, *, answer: str = "allow_once"
) -> tuple[list[RunEvent], RunOutcome]:
    """Run ``prompt``, answering every permission request with ``answer``."""
    run = await lease.start_run(prompt)
    events: list[RunEvent] = []
    async for event in run.events():
        events.append(event)
        if isinstance(event, PermissionRequest):
            event.responder.answer(answer)
    return events, await run.wait()


def asks(events: list[RunEvent]) -> list[str]:
    return [event.request.name for event in events if isinstance(event, PermissionRequest)]


def last_row(events: list[RunEvent]) -> ToolRow:
    return [event for event in events if isinstance(event, ToolRow)][-1]


def write_directive(path: str, content: str = "hello") -> str:
    return "/tool write_file " + orjson.dumps({"path": path, "content": content}).decode()


class ScriptedEngine:
    """Runs ``script(turn)`` as its turn; ``levels`` are its thought levels for any model."""

    def __init__(self, levels: tuple[str, ...] = ()) -> None:
        self.script: Callable[[Turn], Any] | None = None
        self.levels = levels

    def thought_levels(self, model_id: str | None) -> tuple[str, ...]:
        return self.levels

    async def run_turn(self, turn: Turn) -> None:
        assert self.script is not None
        await self.script(turn)


@pytest.mark.parametrize(
    ("mode", "offered"),
    [
        ("ask", {"read_file"}),
        ("code", set(SHARED_TOOLS)),
        ("plan", {"read_file", "update_plan"}),
        ("auto-edit", set(SHARED_TOOLS)),
    ],
)
async def test_each_built_in_mode_offers_its_tools(
    tmp_path: Path, project: Path, mode: str, offered: set[str]
) -> None:
    engine = ScriptedEngine()
    seen: dict[str, Any] = {}

    async def script(turn: Turn) -> None:
        seen["allowed"] = {name for name in SHARED_TOOLS if turn.tool_allowed(name)}
        seen["offered"] = [spec.name for spec in turn.offered_tools]
        seen["planning"] = turn.planning
        seen["mode"] = turn.mode.id

    engine.script = script
    async with (
        demo_service(tmp_path, backend=engine) as service,
        trio.open_nursery() as nursery,
    ):
        router = LoopRouter("mcp")
        lease = await open_lease(
            service,
            nursery,
            project,
            router_factory=lambda n, _: _started(n, router),
        )
        await lease.set_mode(mode)
        _events, outcome = await drive(lease, "go")
        await lease.release(close=True)
    assert outcome.state is RunState.COMPLETED
    assert seen["allowed"] == offered
    assert seen["offered"] == (["external_mcp"] if "external_mcp" in offered else [])
    assert seen["planning"] is (mode == "plan")
    assert seen["mode"] == mode


async def _started(nursery: trio.Nursery, router: LoopRouter) -> LoopRouter:
    await nursery.start(router.serve)
    return router


async def test_code_mode_asks_before_a_write_as_before(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, nursery, project)
        assert lease.mode.id == "code"
        events, _ = await drive(lease, write_directive("a.txt"), answer="deny_once")
        await lease.release(close=True)
    assert asks(events) == ["write_file"]
    assert last_row(events).tool.status is ToolStatus.FAILED
    assert not (project / "a.txt").exists()


async def test_ask_mode_fails_a_write_without_asking(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, nursery, project)
        await lease.set_mode("ask")
        events, outcome = await drive(lease, write_directive("a.txt"))
        shell_events, _ = await drive(lease, '/tool shell {"command": "touch b.txt"}')
        await lease.release(close=True)
    assert outcome.state is RunState.COMPLETED
    assert asks(events) == []
    assert asks(shell_events) == []
    row = last_row(events).tool
    assert row.status is ToolStatus.FAILED
    assert (
        row.output_text
        == "the session is in Ask mode, which does not allow writing or editing files"
    )
    assert last_row(shell_events).tool.status is ToolStatus.FAILED
    assert not (project / "a.txt").exists()
    assert not (project / "b.txt").exists()


async def test_plan_mode_runs_plan_updates_unasked_and_refuses_the_rest(
    tmp_path: Path, project: Path
) -> None:
    engine = ScriptedEngine()
    answers: dict[str, bool] = {}

    async def script(turn: Turn) -> None:
        for name in ("update_plan", "read_file", "write_file", "shell", "external_mcp"):
            request = ToolRequest(tool_id=f"{turn.run_id}-{name}", name=name)
            answers[name] = await turn.ask_permission(request)

    engine.script = script
    async with (
        demo_service(tmp_path, backend=engine) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, nursery, project)
        await lease.set_mode("plan")
        events, _ = await drive(lease, "go")
        await lease.release(close=True)
    # read_file goes to the host's policy, which allows it; nothing reaches the caller.
    assert asks(events) == []
    assert answers == {
        "update_plan": True,
        "read_file": True,
        "write_file": False,
        "shell": False,
        "external_mcp": False,
    }


async def test_auto_edit_writes_inside_the_root_unasked_and_asks_for_the_rest(
    tmp_path: Path, project: Path
) -> None:
    engine = ScriptedEngine()
    answers: dict[str, bool] = {}
    outside = str(tmp_path / "elsewhere.txt")

    async def script(turn: Turn) -> None:
        requests = {
            "inside": ToolRequest(tool_id="1", name="write_file", raw_input={"path": "sub/a.txt"}),
            "absolute": ToolRequest(
                tool_id="2", name="edit_file", raw_input={"path": f"{turn.root}/a.txt"}
            ),
            "outside": ToolRequest(tool_id="3", name="write_file", raw_input={"path": outside}),
            "climbing": ToolRequest(
                tool_id="4", name="write_file", raw_input={"path": "../elsewhere.txt"}
            ),
            "shell": ToolRequest(tool_id="5", name="shell", raw_input={"command": "true"}),
            "mcp": ToolRequest(tool_id="6", name="external_mcp"),
        }
        for key, request in requests.items():
            answers[key] = await turn.ask_permission(request)

    engine.script = script
    async with (
        demo_service(tmp_path, backend=engine) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, nursery, project)
        await lease.set_mode("auto-edit")
        events, _ = await drive(lease, "go", answer="deny_once")
        await lease.release(close=True)
    assert asks(events) == ["write_file", "write_file", "shell", "external_mcp"]
    assert answers == {
        "inside": True,
        "absolute": True,
        "outside": False,
        "climbing": False,
        "shell": False,
        "mcp": False,
    }


async def test_auto_edit_demo_write_runs_unasked_with_its_diff(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, nursery, project)
        await lease.set_mode("auto-edit")
        events, _ = await drive(lease, write_directive("a.txt", "new"), answer="deny_once")
        await lease.release(close=True)
    assert asks(events) == []
    row = last_row(events).tool
    assert row.status is ToolStatus.COMPLETED
    assert [diff.new_text for diff in row.diffs] == ["new"]
    assert (project / "a.txt").read_text() == "new"


async def test_a_backend_that_never_asks_still_cannot_act_in_ask_mode(
    tmp_path: Path, project: Path
) -> None:
    engine = ScriptedEngine()
    refusals: list[str] = []

    async def script(turn: Turn) -> None:
        calls = (
            lambda: turn.tools.run_shell("touch shell.txt", cwd=turn.root),
            lambda: turn.tools.call_external("mcp__x", {}),
            lambda: turn.tools.write_text(turn.root, "w.txt", "x"),
            lambda: turn.tools.edit_text(turn.root, "seed.txt", "seed", "x"),
        )
        for call in calls:
            try:
                await call()
            except ToolUnavailable as exc:
                refusals.append(str(exc))
        # A preview changes nothing and stays allowed.
        await turn.tools.write_text(turn.root, "w.txt", "x", dry_run=True)

    engine.script = script
    (project / "seed.txt").write_text("seed")
    async with (
        demo_service(tmp_path, backend=engine) as service,
        trio.open_nursery() as nursery,
    ):
        router = LoopRouter("mcp")
        lease = await open_lease(
            service, nursery, project, router_factory=lambda n, _: _started(n, router)
        )
        await lease.set_mode("ask")
        _events, outcome = await drive(lease, "go")
        await lease.release(close=True)
    assert outcome.state is RunState.COMPLETED
    assert len(refusals) == 4
    assert all(text.startswith("the session is in Ask mode") for text in refusals)
    assert sorted(p.name for p in project.iterdir()) == ["seed.txt"]
    assert (project / "seed.txt").read_text() == "seed"


async def test_a_mode_change_during_a_turn_applies_at_the_next_tool_call(
    tmp_path: Path, project: Path
) -> None:
    engine = ScriptedEngine()
    changed = trio.Event()
    first_done = trio.Event()
    answers: list[bool] = []

    async def script(turn: Turn) -> None:
        answers.append(await turn.ask_permission(ToolRequest(tool_id="1", name="shell")))
        first_done.set()
        await changed.wait()
        answers.append(await turn.ask_permission(ToolRequest(tool_id="2", name="shell")))

    engine.script = script
    async with (
        demo_service(tmp_path, backend=engine) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, nursery, project)
        run = await lease.start_run("go")
        requests: list[str] = []

        async def read() -> None:
            async for event in run.events():
                if isinstance(event, PermissionRequest):
                    requests.append(event.request.tool_id)
                    event.responder.answer("allow_once")

        async with trio.open_nursery() as readers:
            readers.start_soon(read)
            await first_done.wait()
            await lease.set_mode("ask")
            changed.set()
        await lease.release(close=True)
    # The first call was asked (code mode) and allowed; the second, after the change, was
    # refused without reaching the caller.
    assert requests == ["1"]
    assert answers == [True, False]


async def test_mode_and_level_are_stored_and_restored_on_load(
    tmp_path: Path, project: Path
) -> None:
    engine = ScriptedEngine(levels=("low", "medium", "high"))
    seen: list[str | None] = []

    async def script(turn: Turn) -> None:
        seen.append(turn.thought_level)

    engine.script = script
    async with (
        demo_service(tmp_path, backend=engine) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, nursery, project)
        events = lease.session_events()
        assert lease.thought_levels == ("low", "medium", "high")
        assert lease.thought_level is None
        assert await lease.set_mode("plan") == BUILTIN_MODES.get("plan").mode  # type: ignore[union-attr]
        assert await lease.set_thought_level("high") == "high"
        await drive(lease, "first")
        task_id = lease.task_id
        await lease.release()
        changes = [event async for event in events if isinstance(event, ModeChanged)]
        assert [change.mode.id for change in changes] == ["plan"]
        stored = await service.store.get_task(task_id)
        assert stored is not None
        assert (stored.mode, stored.thought_level) == ("plan", "high")
        loaded: SessionLease = await nursery.start(
            lambda task_status: service.serve_task(task_id, str(project), task_status=task_status)
        )
        assert loaded.mode.id == "plan"
        assert loaded.thought_level == "high"
        await drive(loaded, "second")
        await loaded.set_thought_level(None)
        await drive(loaded, "third")
        await loaded.release()
    assert seen == ["high", "high", None]


async def test_an_unknown_mode_or_level_is_refused_and_nothing_is_stored(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, nursery, project)
        with pytest.raises(RuntimeRejection) as caught:
            await lease.set_mode("yolo")
        assert caught.value.kind is RejectionKind.UNKNOWN_MODE
        # The demo declares no thinking levels: every level is unknown.
        assert lease.thought_levels == ()
        with pytest.raises(RuntimeRejection) as caught:
            await lease.set_thought_level("high")
        assert caught.value.kind is RejectionKind.UNKNOWN_THOUGHT_LEVEL
        stored = await service.store.get_task(lease.task_id)
        assert stored is not None
        assert (stored.mode, stored.thought_level) == (None, None)
        assert lease.mode.id == "code"
        await lease.release(close=True)


READ_ONLY = ModeDeclaration(
    mode=SessionMode(id="look", name="Look", description="Only looks"),
    policy=ToolPolicy(offered=frozenset({ToolCategory.READ})),
)
DEPLOY = ModeDeclaration(
    mode=SessionMode(id="deploy", name="Deploy", description="Runs its own deploy tool"),
    policy=ToolPolicy(
        offered=frozenset({ToolCategory.READ, ToolCategory.OTHER}),
        unasked=frozenset({ToolCategory.OTHER}),
    ),
)


async def test_a_host_declares_its_own_modes_and_a_stored_mode_it_dropped_falls_back(
    tmp_path: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = ScriptedEngine()
    answers: list[bool] = []

    async def script(turn: Turn) -> None:
        answers.append(await turn.ask_permission(ToolRequest(tool_id="1", name="deploy")))

    engine.script = script
    async with temp_store(tmp_path) as store:
        builtin = make_demo_service(store)
        async with builtin:
            builtin.sign_in("account")
            async with trio.open_nursery() as nursery:
                lease = await open_lease(builtin, nursery, project)
                await lease.set_mode("plan")
                await drive(lease, "/echo keep me")
                task_id = lease.task_id
                await lease.release()
        hosts = AgentService(
            store=store,
            backend=engine,
            catalog=demo_catalog(),
            policy=demo_policy(),
            modes=ModeSet((READ_ONLY, DEPLOY), default="look"),
        )
        async with hosts:
            hosts.sign_in("account")
            async with trio.open_nursery() as nursery:
                with caplog.at_level(logging.WARNING, logger="maple_acp.runtime"):
                    lease = await nursery.start(
                        lambda task_status: hosts.serve_task(
                            task_id, str(project), task_status=task_status
                        )
                    )
                assert "no longer offers" in caplog.text
                assert [mode.id for mode in lease.modes] == ["look", "deploy"]
                assert lease.mode.id == "look"
                events, _ = await drive(lease, "in look mode")
                await lease.set_mode("deploy")
                more, _ = await drive(lease, "in deploy mode")
                with pytest.raises(RuntimeRejection):
                    await lease.set_mode("plan")
                await lease.release()
    # OTHER fails closed where the mode does not offer it, runs unasked where it does.
    assert answers == [False, True]
    assert asks(events) == []
    assert asks(more) == []


async def test_unplaced_tools_fail_closed_in_ask_mode_and_go_to_the_policy_in_code(
    tmp_path: Path, project: Path
) -> None:
    engine = ScriptedEngine()
    answers: list[bool] = []

    async def script(turn: Turn) -> None:
        answers.append(await turn.ask_permission(ToolRequest(tool_id="a", name="deploy")))
        # A backend's own read-only tool placed as READ; a shared name keeps its own category.
        placed = ToolRequest(tool_id="b", name="grep", category=ToolCategory.READ)
        answers.append(await turn.ask_permission(placed))
        lying = ToolRequest(tool_id="c", name="shell", category=ToolCategory.READ)
        answers.append(await turn.ask_permission(lying))

    engine.script = script
    async with (
        demo_service(tmp_path, backend=engine) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, nursery, project)
        await lease.set_mode("ask")
        ask_events, _ = await drive(lease, "in ask mode")
        await lease.set_mode("code")
        code_events, _ = await drive(lease, "in code mode", answer="deny_once")
        await lease.release(close=True)
    # The demo policy allows every tool but shell and write_file.
    assert answers == [False, True, False, True, True, False]
    assert asks(ask_events) == []
    assert asks(code_events) == ["shell"]


def test_a_mode_set_needs_modes_unique_ids_and_a_declared_default() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ModeSet((), default="code")
    with pytest.raises(ValueError, match="twice"):
        ModeSet((CODE_MODE, CODE_MODE), default="code")
    with pytest.raises(ValueError, match="default"):
        ModeSet((CODE_MODE,), default="ask")
    blank = ModeDeclaration(mode=SessionMode(id="", name="Blank"), policy=CODE_MODE.policy)
    with pytest.raises(ValueError, match="plain characters"):
        ModeSet((blank,), default="")
    with pytest.raises(ValueError, match="unasked"):
        ToolPolicy(offered=frozenset(), unasked=frozenset({ToolCategory.EDIT}))
    assert [mode.id for mode in BUILTIN_MODES.modes] == ["ask", "code", "plan", "auto-edit"]
    assert BUILTIN_MODES.default is CODE_MODE
