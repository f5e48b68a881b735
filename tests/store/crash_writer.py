"""A host stand-in for the crash tests: admit one user message, announce it, then keep
writing assistant rows until killed. With ``delete``, it deletes the task once the message is
in, announces that instead, and keeps writing to a second task until killed.

Usage: python crash_writer.py STORE_FILE TASK_ID MESSAGE [delete]

The crash tests import ``kill_writer_after`` from here to run it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import trio

from maple_acp.model import ItemKind, TaskSurface, TimelineItem
from maple_acp.store import SqliteTaskStore
from maple_acp.testing.store import task_record

REPO_ROOT = Path(__file__).resolve().parents[2]


async def kill_writer_after(
    marker: bytes, *args: str, marker_within_s: float, linger: float = 0.0
) -> None:
    """Run this script with ``args``; once it printed ``marker`` (within ``marker_within_s``) and
    ``linger`` seconds more have passed, kill it with SIGKILL, and check the kill ended it."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, __file__, *args]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(trio.run_process, command, stdout=subprocess.PIPE, check=False, env=env)
        )
        assert process.stdout is not None
        seen = b""
        with trio.fail_after(marker_within_s):
            while marker not in seen:
                chunk = await process.stdout.receive_some()
                assert chunk, f"the writer exited before printing {marker!r}"
                seen += chunk
        await trio.sleep(linger)
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL


async def main(path: str, task_id: str, message: str, mode: str = "") -> None:
    store = await SqliteTaskStore.open(path)
    await store.create_task(
        task_record(
            id=task_id,
            created_ms=1,
            updated_ms=1,
            surface=TaskSurface.EXTERNAL,
            provisional=True,
        )
    )
    await store.admit_user_message(
        task_id,
        TimelineItem(item_id="user-1", kind=ItemKind.USER, created_ms=2, text=message),
        now_ms=2,
    )
    if mode == "delete":
        if not await store.delete_task(task_id):
            raise SystemExit("the task was not deleted")
        task_id = f"{task_id}-other"
        await store.create_task(task_record(id=task_id, created_ms=1, updated_ms=1))
        sys.stdout.write("DELETED\n")
    else:
        sys.stdout.write("ADMITTED\n")
    sys.stdout.flush()
    n = 0
    while True:
        n += 1
        await store.upsert_items(
            task_id,
            [
                TimelineItem(
                    item_id=f"assistant-{n}",
                    kind=ItemKind.ASSISTANT,
                    created_ms=n,
                    text="chunk " * 50,
                )
            ],
            now_ms=2 + n,
        )


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:5])
