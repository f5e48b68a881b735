"""An admitted user message survives ``kill -9`` of the process that wrote it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from maple_acp.store import ItemKind
from maple_acp.testing.store import STORE_FILE_NAME, temp_store

WRITER = Path(__file__).with_name("crash_writer.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Generous: the child only has to import trio and write two transactions.
ADMIT_TIMEOUT_S = 30


@pytest.mark.parametrize("attempt", range(3))
async def test_admitted_message_survives_sigkill(tmp_path: Path, attempt: int) -> None:
    message = f"please keep this message #{attempt}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, str(WRITER), str(tmp_path / STORE_FILE_NAME), "task", message]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(trio.run_process, command, stdout=subprocess.PIPE, check=False, env=env)
        )
        assert process.stdout is not None
        seen = b""
        with trio.fail_after(ADMIT_TIMEOUT_S):
            while b"ADMITTED\n" not in seen:
                chunk = await process.stdout.receive_some()
                assert chunk, "the writer exited before admitting the message"
                seen += chunk
        # Let it write a few more rows so the kill lands in the middle of the write loop.
        await trio.sleep(0.05 * attempt)
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL

    async with temp_store(tmp_path) as store:
        task = await store.get_task("task")
        assert task is not None
        assert task.provisional is False
        history = await store.history("task")
        assert history[0].kind is ItemKind.USER
        assert history[0].text == message
        assert [i.seq for i in history] == list(range(1, len(history) + 1))
