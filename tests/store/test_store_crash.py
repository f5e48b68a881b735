"""An admitted user message survives ``kill -9`` of the process that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest
from crash_writer import kill_writer_after

from maple_acp.model import ItemKind
from maple_acp.testing.store import STORE_FILE_NAME, temp_store

#: Generous: the child only has to import trio and write two transactions.
ADMIT_TIMEOUT_S = 30


@pytest.mark.parametrize("attempt", range(3))
async def test_admitted_message_survives_sigkill(tmp_path: Path, attempt: int) -> None:
    message = f"please keep this message #{attempt}"
    # The linger lets it write a few more rows so the kill lands in the middle of the loop.
    await kill_writer_after(
        b"ADMITTED\n",
        *(str(tmp_path / STORE_FILE_NAME), "task", message),
        marker_within_s=ADMIT_TIMEOUT_S,
        linger=0.05 * attempt,
    )

    async with temp_store(tmp_path) as store:
        task = await store.get_task("task")
        assert task is not None
        assert task.provisional is False
        history = await store.history("task")
        assert history[0].kind is ItemKind.USER
        assert history[0].text == message
        assert [i.seq for i in history] == list(range(1, len(history) + 1))
