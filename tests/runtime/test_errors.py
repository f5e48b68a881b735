"""One error tree, one cut rule: every exception the runtime raises on purpose is a
``MapleAcpError``, and text the runtime cuts ends with the named marker."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from maple_acp import MapleAcpError
from maple_acp._text import CUT_TEXT
from maple_acp.model import ItemKind
from maple_acp.runtime import (
    AgentService,
    RejectionKind,
    RuntimeRejection,
    SessionLease,
    ToolContext,
    ToolUnavailable,
    TurnFailed,
)
from maple_acp.runtime._journal import MAX_STORED_MESSAGE_CHARS
from maple_acp.testing.demo import run_prompt


def test_runtime_exceptions_share_the_library_root() -> None:
    for kind in (RuntimeRejection, TurnFailed, ToolUnavailable):
        assert issubclass(kind, MapleAcpError), kind


async def test_one_clause_catches_a_refusal(service: AgentService) -> None:
    with pytest.raises(MapleAcpError) as caught:
        await service.list_tasks(cursor="not-a-cursor-we-issued")
    assert isinstance(caught.value, RuntimeRejection)
    assert caught.value.kind is RejectionKind.INVALID_CURSOR
    with pytest.raises(MapleAcpError):
        await ToolContext().call_external("x", {})


async def test_a_stored_message_over_the_limit_ends_with_the_text_marker(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(str(project), task_status=task_status)
        )
        # Two chunks of one message, together just past the stored limit.
        chunk = MAX_STORED_MESSAGE_CHARS // 2 + 5
        _events, outcome = await run_prompt(lease, f"/stream 2 {chunk}")
        assert outcome.state.value == "completed"
        history = await lease.history()
        await lease.release(close=True)
    assistant = [item for item in history if item.kind is ItemKind.ASSISTANT]
    assert len(assistant) == 1
    assert len(assistant[0].text) == MAX_STORED_MESSAGE_CHARS
    assert assistant[0].text.endswith(CUT_TEXT)
