"""What the ACP-level MCP tests share: a running ACP service over the demo runtime, ACP
``mcpServers`` entries for the loopback servers, and a reader of what those servers saw."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio
import trio.testing

from maple_acp.testing.client import AcpTestClient, PermissionPolicy, allow
from maple_acp.testing.service import AcpHarness as SharedHarness
from maple_acp.testing.service import running_demo_acp

#: Polling the loopback servers (another process) for an event gives up after this long.
EVENT_WAIT_S = 10.0


class AcpHarness(SharedHarness):
    """The shared harness, plus readers of the raw store file for the secrets tests."""

    @asynccontextmanager
    async def connect(  # type: ignore[override]
        self, *, permission: PermissionPolicy = allow, initialize: bool = True, **options: Any
    ) -> AsyncIterator[AcpTestClient]:
        async with super().connect(
            initialize=initialize, permission=permission, **options
        ) as client:
            yield client

    def stored_task_ids(self) -> list[str]:
        """Every task row in the store file, provisional ones included (read directly)."""
        with sqlite3.connect(f"file:{self.store_path}?mode=ro", uri=True) as db:
            return [row[0] for row in db.execute("SELECT id FROM tasks")]

    def store_bytes(self) -> bytes:
        """The store file and its WAL and shared-memory companions, as they are on disk."""
        out = b""
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = Path(f"{self.store_path}{suffix}")
            if path.exists():
                out += path.read_bytes()
        return out


@asynccontextmanager
async def running_acp(tmp_path: Path, **options: Any) -> AsyncIterator[AcpHarness]:
    async with running_demo_acp(tmp_path, harness_type=AcpHarness, **options) as harness:
        assert isinstance(harness, AcpHarness)
        yield harness


def acp_http_server(
    url: str, name: str = "main", *, tag: str | None = None, **headers: str
) -> dict[str, Any]:
    """An ACP ``mcpServers`` entry of type ``http``; ``tag`` lets the server find its requests."""
    pairs = [{"name": key.replace("_", "-"), "value": value} for key, value in headers.items()]
    if tag is not None:
        pairs.insert(0, {"name": "X-Test-Tag", "value": tag})
    return {"type": "http", "name": name, "url": url, "headers": pairs}


class Loopback:
    """The loopback MCP servers of ``loopback_servers.py``: their URLs and what they saw."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports

    def url(self, variant: str = "main", *, query: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[variant]}/mcp" + (f"?{query}" if query else "")

    async def _get(self, path: str) -> Any:
        async with httpx2.AsyncClient(trust_env=False, timeout=5.0) as client:
            response = await client.get(f"http://127.0.0.1:{self.ports['main']}{path}")
            response.raise_for_status()
            return response.json()

    async def records(self, tag: str) -> list[dict[str, Any]]:
        """Every MCP request the main server received with ``X-Test-Tag: tag``, in order."""
        records: list[dict[str, Any]] = await self._get(f"/_records?tag={tag}")
        return records

    async def methods(self, tag: str) -> list[str]:
        return [record["method"] for record in await self.records(tag)]

    async def events(self, key: str) -> list[str]:
        """The slow tool's lifecycle under ``key``: ``started``, then ``cancelled``."""
        events: list[str] = await self._get(f"/_events?key={key}")
        return events

    async def wait_for_event(self, key: str, event: str) -> None:
        with trio.fail_after(EVENT_WAIT_S):
            # The servers live in another process; polling is the only way to observe them.
            while event not in await self.events(key):  # noqa: ASYNC110
                await trio.sleep(0.02)

    async def wait_for_method(self, tag: str, method: str) -> None:
        with trio.fail_after(EVENT_WAIT_S):
            while method not in await self.methods(tag):  # noqa: ASYNC110
                await trio.sleep(0.02)
