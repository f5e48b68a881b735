"""A host killed with SIGKILL in the middle of a run keeps the admitted user message."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import trio

from maple_acp.model import ItemKind, TaskQuery
from maple_acp.testing.demo import DEMO_ACCOUNT, demo_service

HOST = textwrap.dedent(
    """
    import sys, trio
    from maple_acp.testing.demo import demo_service

    async def main(data, project):
        async with demo_service(data) as service, trio.open_nursery() as nursery:
            lease = await nursery.start(service.serve_new_task, project)
            run = await lease.start_run("remember this\\n/stream 3 5\\n/hang")
            events = run.events()
            for _ in range(3):
                await events.__anext__()
            sys.stdout.write(lease.task_id + "\\n")
            sys.stdout.flush()
            await trio.sleep_forever()

    trio.run(main, sys.argv[1], sys.argv[2])
    """
)


async def killed_after_its_line(script: str, data: Path, project: Path) -> str:
    """Run host ``script`` on ``data`` and ``project`` until it prints its task's id, then
    SIGKILL it; the id."""
    data.mkdir()
    project.mkdir()
    async with trio.open_nursery() as nursery:
        host: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-c", script, str(data), str(project)],
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        assert host.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await host.stdout.receive_some(1024)
                assert chunk, "the host exited early"
                line += chunk
        os.kill(host.pid, signal.SIGKILL)
        assert await host.wait() == -signal.SIGKILL
    return line.decode().strip()


async def test_admitted_message_survives_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    task_id = await killed_after_its_line(HOST, data, tmp_path / "project")
    # Reopen: the start-up sweep runs, and the prompted task and its message are there.
    async with demo_service(data) as service:
        history = await service.task_history(task_id)
        assert history[0].kind is ItemKind.USER
        assert history[0].text.startswith("remember this")
        page = await service.store.list_tasks(TaskQuery(account=DEMO_ACCOUNT))
        assert [task.id for task in page.tasks] == [task_id]


DELEGATING_HOST = textwrap.dedent(
    """
    import sys, trio
    from maple_acp.runtime import ChildEvent, PermissionRequest
    from maple_acp.testing.demo import demo_service

    async def main(data, project):
        async with demo_service(data) as service, trio.open_nursery() as nursery:
            lease = await nursery.start(service.serve_new_task, project)
            run = await lease.start_run("remember this\\n/delegate T :: child words")
            async for event in run.events():
                if isinstance(event, ChildEvent) and isinstance(event.event, PermissionRequest):
                    break
            sys.stdout.write(lease.task_id + "\\n")
            sys.stdout.flush()
            await trio.sleep_forever()

    trio.run(main, sys.argv[1], sys.argv[2])
    """
)


async def test_a_delegation_killed_midway_keeps_both_admitted_messages(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # Killed while the child waits on its permission question inside the parent's run.
    task_id = await killed_after_its_line(DELEGATING_HOST, data, tmp_path / "project")
    async with demo_service(data) as service:
        history = await service.task_history(task_id)
        assert history[0].text.startswith("remember this")
        (child,) = await service.store.children(task_id)
        child_history = await service.store.history(child.id)
        assert (child_history[0].kind, child_history[0].text) == (ItemKind.USER, "child words")
        assert child_history[1].text == "working on: child words"
        page = await service.store.list_tasks(TaskQuery(account=DEMO_ACCOUNT))
        assert [task.id for task in page.tasks] == [task_id]
