"""The demo backend's script grammar, its shell tool (real processes in their own process
groups, relay environment, killed on cancel and revoke), its file write, plans, context usage,
available commands, and its external tool call."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from maple_acp.backends.demo import (
    DEMO_COMMANDS,
    DEMO_MODELS,
    DemoBackend,
    demo_catalog,
    parse_plan,
)
from maple_acp.runtime import (
    MAX_PLAN_ENTRIES,
    AgentService,
    ContextUsage,
    ItemKind,
    PermissionRequest,
    PlanEntry,
    PlanStatus,
    PlanUpdated,
    RunEnded,
    RunNotice,
    RunState,
    SessionLease,
    TextChunk,
    ToolLocation,
    ToolRow,
    ToolStatus,
    TurnFailed,
)
from maple_acp.testing.demo import collect_events, run_prompt


def shell(command: str) -> str:
    return "/tool shell " + json.dumps({"command": command})


async def allow_all(run: Any) -> list[Any]:
    events = []
    async for event in run.events():
        events.append(event)
        if isinstance(event, PermissionRequest):
            event.responder.answer("allow_once")
    return events


def read(path: Path) -> str:
    with open(path) as handle:
        return handle.read()


def process_gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a reaper."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in (b"Z", b"X")


async def read_fifo(path: Path) -> str:
    """Block (on a worker thread) until a child writes a line into the FIFO ``path``."""
    with trio.fail_after(10):
        return await trio.to_thread.run_sync(read, path, abandon_on_cancel=True)


async def relay_lease(service: AgentService, project: Path, nursery: trio.Nursery) -> SessionLease:
    lease: SessionLease = await nursery.start(
        lambda task_status: service.serve_new_task(
            str(project), relay={"MAPLE_TOKEN": "s3cret"}, task_status=task_status
        )
    )
    return lease


def test_demo_catalog_offers_a_default_an_alternative_and_a_non_chat_model() -> None:
    catalog = demo_catalog()
    assert catalog.default_model("any") == DEMO_MODELS[0]
    assert [model.chat for model in DEMO_MODELS] == [True, True, False]


async def test_shell_runs_with_the_relay_environment_in_its_own_group(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await relay_lease(service, project, nursery)
        run = await lease.start_run(shell('echo "token=$MAPLE_TOKEN"; ps -o pgid= -p $$'))
        events = await allow_all(run)
        assert (await run.wait()).state is RunState.COMPLETED
        final = [e for e in events if isinstance(e, ToolRow)][-1].tool
        assert final.status is ToolStatus.COMPLETED
        assert final.output_text is not None
        lines = final.output_text.split()
        assert lines[0] == "token=s3cret"
        # The child leads its own process group, not the host's.
        assert int(lines[1]) != os.getpgid(0)
        assert final.raw_output["exitCode"] == 0
        history = await lease.history()
        assert history[-1].text.startswith("token=s3cret")
        assert history[-1].tool is not None
        assert history[-1].tool.raw_input == {
            "command": 'echo "token=$MAPLE_TOKEN"; ps -o pgid= -p $$'
        }
        await lease.release(close=True)


async def test_shell_output_is_bounded(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(shell("head -c 200000 /dev/zero | tr '\\0' a"))
        events = await allow_all(run)
        final = [e for e in events if isinstance(e, ToolRow)][-1].tool
        assert final.raw_output["truncated"] is True
        assert len(final.raw_output["output"]) == 64 * 1024
        await lease.release(close=True)


async def _start_sleeper(lease: SessionLease, project: Path) -> tuple[Any, int]:
    fifo = project / "pid"
    os.mkfifo(fifo)
    run = await lease.start_run(shell(f"sleep 600 & echo $! > {fifo}; wait"))
    events = run.events()
    async for event in events:
        if isinstance(event, PermissionRequest):
            event.responder.answer("allow_once")
            break
    return run, int(await read_fifo(fifo))


async def test_cancel_kills_the_whole_process_group(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await relay_lease(service, project, nursery)
        run, grandchild = await _start_sleeper(lease, project)
        assert not process_gone(grandchild)
        run.cancel()
        assert (await run.wait()).state is RunState.CANCELLED
        assert process_gone(grandchild)
        assert lease.tools.live_process_groups == frozenset()
        await lease.release(close=True)


async def test_revoke_kills_the_whole_process_group(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await relay_lease(service, project, nursery)
        run, grandchild = await _start_sleeper(lease, project)
        lease.revoke()
        await run.wait()
        await lease.release()
        assert process_gone(grandchild)


async def test_background_child_outliving_the_command_dies_with_the_lease(
    service: AgentService, project: Path
) -> None:
    pidfile = project / "pid"
    async with trio.open_nursery() as nursery:
        lease = await relay_lease(service, project, nursery)
        # The command returns at once; its background child keeps the credential.
        run = await lease.start_run(shell(f"sleep 600 > /dev/null 2>&1 & echo $! > {pidfile}"))
        await allow_all(run)
        assert (await run.wait()).state is RunState.COMPLETED
        child = int(read(pidfile))
        assert not process_gone(child)
        await lease.release()
        assert process_gone(child)


async def test_mcp_without_router_is_a_clear_tool_error(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run('/mcp srv__ping {"x": 1}')
        events = await allow_all(run)
        assert any(isinstance(e, PermissionRequest) for e in events)
        final = [e for e in events if isinstance(e, ToolRow)][-1].tool
        assert final.status is ToolStatus.FAILED
        assert final.output_text == "no external MCP servers are connected to this session"
        await lease.release(close=True)


class EchoRouter:
    def __init__(self) -> None:
        self.revoked = False
        self.call_ids: list[str | None] = []

    def tool_definition(self) -> Any:
        return None

    async def call(
        self, tool_id: str, arguments: dict[str, Any], *, call_id: str | None = None
    ) -> dict[str, Any]:
        self.call_ids.append(call_id)
        if tool_id == "srv__broken":
            raise RuntimeError("the tool failed")
        return {"echo": [tool_id, arguments]}

    def revoke(self) -> None:
        self.revoked = True


async def test_mcp_routes_through_the_lease_router(service: AgentService, project: Path) -> None:
    router = EchoRouter()

    async def factory(nursery: trio.Nursery, task_id: str) -> EchoRouter:
        return router

    async with trio.open_nursery() as nursery:
        lease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project), router_factory=factory, task_status=task_status
            )
        )
        run = await lease.start_run('/mcp srv__ping {"x": 1}\n/mcp srv__broken {}')
        events = await allow_all(run)
        rows = [e.tool for e in events if isinstance(e, ToolRow) and e.tool.status.terminal]
        assert rows[0].status is ToolStatus.COMPLETED
        assert rows[0].raw_output == {"echo": ["srv__ping", {"x": 1}]}
        assert rows[1].status is ToolStatus.FAILED
        assert rows[1].output_text == "the tool failed"
        # The router is told which tool call each is (a server in the client hears of it).
        ended = [e.tool_id for e in events if isinstance(e, ToolRow) and e.tool.status.terminal]
        assert router.call_ids == ended
        await lease.release(close=True)
        assert router.revoked


async def test_script_errors_fail_the_turn_clearly(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        for script in ("/usage one two", "/stream 1", "/tool shell [1]", "/tool nope {}"):
            events, outcome = await run_prompt(lease, script)
            assert outcome.state is RunState.FAILED
            assert isinstance(events[-2], RunNotice)
            assert isinstance(events[-1], RunEnded)
        await lease.release(close=True)


async def test_hang_waits_for_cancel(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/hang")
        await trio.testing.wait_all_tasks_blocked()
        assert not run.ended
        run.cancel()
        events = await collect_events(run)
        assert isinstance(events[-1], RunEnded)
        await lease.release(close=True)


def write_file(path: str, content: Any) -> str:
    return "/tool write_file " + json.dumps({"path": path, "content": content})


async def deny_all(run: Any) -> list[Any]:
    events = []
    async for event in run.events():
        events.append(event)
        if isinstance(event, PermissionRequest):
            event.responder.answer("deny_once")
    return events


def tool_rows(events: list[Any]) -> list[Any]:
    return [e.tool for e in events if isinstance(e, ToolRow)]


def test_plan_markers_set_each_status() -> None:
    assert parse_plan(" [x] read ; [>] fix;; test ;[ ] ship; [X] again ") == (
        PlanEntry(content="read", status=PlanStatus.COMPLETED),
        PlanEntry(content="fix", status=PlanStatus.IN_PROGRESS),
        PlanEntry(content="test"),
        PlanEntry(content="ship"),
        PlanEntry(content="again", status=PlanStatus.COMPLETED),
    )
    assert parse_plan("") == ()
    # A marker alone is no step; a marker not at the start is text.
    assert parse_plan("[x]; do [x] this") == (PlanEntry(content="do [x] this"),)
    with pytest.raises(TurnFailed):
        parse_plan(";".join(["step"] * (MAX_PLAN_ENTRIES + 1)))


def test_every_directive_is_an_available_command() -> None:
    commands = DemoBackend().available_commands()
    assert commands == DEMO_COMMANDS
    names = [command.name for command in commands]
    assert len(set(names)) == len(names)
    for command in commands:
        assert command.description
        assert "\n" not in command.description
        assert len(command.description) <= 80
    # Each declared command is a directive the demo runs, and the module documents it.
    from maple_acp.backends import demo

    assert set(names) == set(demo._DIRECTIVES)
    assert demo.__doc__ is not None
    for name in names:
        assert f"``/{name}" in demo.__doc__


async def test_a_session_of_the_demo_offers_its_directives(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        assert lease.commands == DEMO_COMMANDS
        await lease.release(close=True)


async def test_plan_is_sent_whole_and_the_latest_is_kept(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(lease, "/plan [x] one; [>] two; three\n/plan [x] all")
        assert outcome.state is RunState.COMPLETED
        plans = [e.entries for e in events if isinstance(e, PlanUpdated)]
        assert plans == [
            (
                PlanEntry(content="one", status=PlanStatus.COMPLETED),
                PlanEntry(content="two", status=PlanStatus.IN_PROGRESS),
                PlanEntry(content="three"),
            ),
            (PlanEntry(content="all", status=PlanStatus.COMPLETED),),
        ]
        stored = [item for item in await lease.history() if item.kind is ItemKind.PLAN]
        assert stored[-1].plan == (PlanEntry(content="all", status=PlanStatus.COMPLETED),)
        await lease.release(close=True)


async def test_context_reports_used_and_size(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(lease, "/context 900 800")
        assert outcome.state is RunState.COMPLETED
        [usage] = [e for e in events if isinstance(e, ContextUsage)]
        # More used than the window holds is reported as it is.
        assert (usage.used, usage.size) == (900, 800)
        for script in ("/context", "/context 1", "/context -1 5", "/context a b", "/context 1 2 3"):
            events, outcome = await run_prompt(lease, script)
            assert outcome.state is RunState.FAILED
            assert outcome.failure is not None
            assert outcome.failure.startswith("/context takes")
            assert not any(isinstance(e, ContextUsage) for e in events)
        await lease.release(close=True)


async def test_an_unknown_directive_lists_the_directives(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(lease, "/unknown directive\n/echo after")
        assert outcome.state is RunState.COMPLETED
        [notice] = [e for e in events if isinstance(e, RunNotice)]
        assert not notice.terminal
        assert notice.text.startswith("The demo has no directive /unknown.")
        for command in DEMO_COMMANDS:
            assert f"/{command.name}" in notice.text
        # Nothing echoed the line; the script went on.
        assert [e.text for e in events if isinstance(e, TextChunk)] == ["after"]
        await lease.release(close=True)


async def test_a_line_that_only_starts_with_a_slash_is_text(
    service: AgentService, project: Path
) -> None:
    # A path or a fraction at the start of a line is not a directive name.
    text = "/usr/bin/env is missing\n/ 2 is a half\n//comment\n/echo-ish/x"
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(lease, text + "\n/echo done")
        assert outcome.state is RunState.COMPLETED
        assert not any(isinstance(e, RunNotice) for e in events)
        assert [e.text for e in events if isinstance(e, TextChunk)] == [text, "done"]
        await lease.release(close=True)


async def test_fail_ends_the_turn_with_its_message_and_runs_nothing_after(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        events, outcome = await run_prompt(lease, "/echo before\n/fail it broke\n/echo after")
        assert outcome.state is RunState.FAILED
        assert outcome.failure == "it broke"
        assert [e.text for e in events if isinstance(e, TextChunk)] == ["before"]
        assert isinstance(events[-2], RunNotice)
        assert events[-2].terminal
        assert events[-2].text == "it broke"
        # The failure text is live only: the history keeps the prompt and what was sent.
        history = await lease.history()
        assert [item.text for item in history] == [
            "/echo before\n/fail it broke\n/echo after",
            "before",
        ]
        await lease.release(close=True)


async def test_write_file_asks_then_writes_with_a_diff_and_location(
    service: AgentService, project: Path
) -> None:
    (project / "a.txt").write_text("one\ntwo\n")
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(write_file("a.txt", "one\nTWO\n"))
        events = await allow_all(run)
        assert (await run.wait()).state is RunState.COMPLETED
        assert (project / "a.txt").read_text() == "one\nTWO\n"
        target = str((project / "a.txt").resolve())
        [ask] = [e for e in events if isinstance(e, PermissionRequest)]
        assert ask.request.name == "write_file"
        rows = tool_rows(events)
        # While the caller decides, the row already shows the change.
        asked_at = events.index(ask)
        shown = [e.tool for e in events[:asked_at] if isinstance(e, ToolRow)][-1]
        assert shown.diffs[0].old_text == "one\ntwo\n"
        assert shown.diffs[0].new_text == "one\nTWO\n"
        final = rows[-1]
        assert final.status is ToolStatus.COMPLETED
        [diff] = final.diffs
        assert (diff.path, diff.old_text, diff.new_text) == (target, "one\ntwo\n", "one\nTWO\n")
        assert final.locations == (ToolLocation(path=target, line=2),)
        history = await lease.history()
        assert history[-1].tool is not None
        assert history[-1].tool.diffs == final.diffs
        await lease.release(close=True)


async def test_write_file_creates_a_new_file_and_its_directories(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(write_file("deep/er/new.txt", "hi"))
        events = await allow_all(run)
        final = tool_rows(events)[-1]
        assert final.status is ToolStatus.COMPLETED
        assert (project / "deep" / "er" / "new.txt").read_text() == "hi"
        assert final.diffs[0].old_text is None
        await lease.release(close=True)


async def test_write_file_denied_writes_nothing(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(write_file("a.txt", "x"))
        events = await deny_all(run)
        assert (await run.wait()).state is RunState.COMPLETED
        final = tool_rows(events)[-1]
        assert final.status is ToolStatus.FAILED
        assert final.output_text == "permission denied"
        assert not (project / "a.txt").exists()
        await lease.release(close=True)


async def test_write_file_outside_the_root_is_a_failed_row_without_asking(
    service: AgentService, project: Path, tmp_path: Path
) -> None:
    (project / "link").symlink_to(tmp_path)
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        for path in ("../escape.txt", str(tmp_path / "escape.txt"), "link/escape.txt"):
            run = await lease.start_run(write_file(path, "x"))
            events = await allow_all(run)
            assert (await run.wait()).state is RunState.COMPLETED
            assert not any(isinstance(e, PermissionRequest) for e in events)
            final = tool_rows(events)[-1]
            assert final.status is ToolStatus.FAILED
            assert final.output_text is not None
            assert "outside" in final.output_text
            assert not (tmp_path / "escape.txt").exists()
        await lease.release(close=True)


@pytest.mark.parametrize(
    "arguments",
    [
        {"content": "x"},
        {"path": "", "content": "x"},
        {"path": "a.txt"},
        {"path": "a", "content": 3},
    ],
)
async def test_write_file_bad_arguments_fail_the_row(
    service: AgentService, project: Path, arguments: dict[str, Any]
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/tool write_file " + json.dumps(arguments))
        events = await allow_all(run)
        assert (await run.wait()).state is RunState.COMPLETED
        final = tool_rows(events)[-1]
        assert final.status is ToolStatus.FAILED
        assert not any(isinstance(e, PermissionRequest) for e in events)
        assert list(project.iterdir()) == []
        await lease.release(close=True)


async def test_write_file_over_a_binary_file_fails_without_asking(
    service: AgentService, project: Path
) -> None:
    (project / "blob.bin").write_bytes(b"\xff\xfe\x00")
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(write_file("blob.bin", "text"))
        events = await allow_all(run)
        final = tool_rows(events)[-1]
        assert final.status is ToolStatus.FAILED
        assert final.output_text == "'blob.bin' is not UTF-8 text"
        assert not any(isinstance(e, PermissionRequest) for e in events)
        assert (project / "blob.bin").read_bytes() == b"\xff\xfe\x00"
        await lease.release(close=True)
