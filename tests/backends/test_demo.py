"""The demo backend's script grammar, its shell tool (real processes in their own process
groups, relay environment, killed on cancel and revoke) and its external tool call."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio
import trio.testing

from maple_acp.backends.demo import DEMO_MODELS, demo_catalog
from maple_acp.runtime import (
    AgentService,
    PermissionRequest,
    RunEnded,
    RunNotice,
    RunState,
    SessionLease,
    TextChunk,
    ToolRow,
)
from maple_acp.store import ToolStatus
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
    return await nursery.start(
        lambda task_status: service.serve_new_task(
            str(project), relay={"MAPLE_TOKEN": "s3cret"}, task_status=task_status
        )
    )


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
        assert final.raw_output["exit_code"] == 0
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

    def tool_definition(self) -> Any:
        return None

    async def call(self, tool_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if tool_id == "srv__broken":
            raise RuntimeError("the tool failed")
        return {"echo": [tool_id, arguments]}

    def revoke(self) -> None:
        self.revoked = True


async def test_mcp_routes_through_the_lease_router(service: AgentService, project: Path) -> None:
    router = EchoRouter()

    async def factory(nursery: trio.Nursery) -> EchoRouter:
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
        events, outcome = await run_prompt(lease, "/unknown directive")
        assert outcome.state is RunState.COMPLETED
        assert [e.text for e in events if isinstance(e, TextChunk)] == ["/unknown directive"]
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
