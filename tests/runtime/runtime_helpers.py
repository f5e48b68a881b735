"""Shared test helpers (imported by the test modules next to this file)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import trio

from maple_acp.cli._host import STORE_FILE_NAME
from maple_acp.model import ToolState
from maple_acp.runtime import (
    EXTERNAL_MCP_TOOL,
    AgentService,
    PermissionRequest,
    RunEvent,
    ToolRow,
)

E = TypeVar("E")


async def next_event(events: AsyncIterator[RunEvent], kind: type[E]) -> E:
    """Read events until one of ``kind``; fail if the run ends first."""
    async for event in events:
        if isinstance(event, kind):
            return event
    raise AssertionError(f"the run ended without a {kind.__name__}")


def of_type(events: list[RunEvent], kind: type[E]) -> list[E]:
    return [event for event in events if isinstance(event, kind)]


def exists(path: Path) -> bool:
    """Whether ``path`` exists (a sync helper: the tests check files between awaits)."""
    return os.path.exists(path)


class LoopRouter:
    """An in-process external tool router: the runtime's ``ExternalToolRouter`` protocol with
    a serve task in the lease's nursery, as the MCP router has."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.revoked = False
        self.serving = False
        self._stop = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.serving = True
        task_status.started()
        try:
            await self._stop.wait()
        finally:
            self.serving = False

    def tool_definition(self) -> Any:
        return _Definition()

    async def call(self, tool_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return {"content": [{"type": "text", "text": f"{self.name}:{tool_id}"}]}

    def revoke(self) -> None:
        self.revoked = True
        self._stop.set()


class _Definition:
    name = EXTERNAL_MCP_TOOL
    description = "tools of the caller"
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}


async def shell_row(
    service: AgentService, project: Path, command: str, relay: dict[str, str]
) -> ToolState:
    """The terminal tool row of one demo ``shell`` call (allowed) on a new lease given
    ``relay``."""
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project), relay=service.accept_relay(relay), task_status=task_status
            )
        )
        run = await lease.start_run("/tool shell " + json.dumps({"command": command}))
        final: ToolState | None = None
        async for event in run.events():
            if isinstance(event, PermissionRequest):
                assert event.responder.answer("allow_once")
            if isinstance(event, ToolRow) and event.tool.status.terminal:
                final = event.tool
        await lease.release(close=False)
    assert final is not None
    return final


def store_bytes(data: Path) -> bytes:
    """The SQLite store's bytes in ``data``: the file, its ``-wal`` and ``-shm``."""
    names = (STORE_FILE_NAME, f"{STORE_FILE_NAME}-wal", f"{STORE_FILE_NAME}-shm")
    return b"".join((data / name).read_bytes() for name in names if (data / name).exists())
