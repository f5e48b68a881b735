"""A failed shell command's row says its exit code in its text, not only in
``rawOutput.exitCode``: a client that shows a row's text and nothing else (its raw output,
a v2 terminal) still sees why it failed. Foreground and background, v1 and v2."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path, config=AcpServiceConfig(protocol_max=2)) as running:
        yield running


@asynccontextmanager
async def session(
    harness: Harness, project: Path, version: int
) -> AsyncIterator[tuple[AcpTestClient, str]]:
    async with harness.connect() as client:
        params: dict[str, Any] = {"protocolVersion": 1, "clientCapabilities": {}}
        if version == 2:
            params = {"protocolVersion": 2, "info": {"name": "t", "version": "0"}}
            params["capabilities"] = {}
        assert (await client.call("initialize", params))["protocolVersion"] == version
        new = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
        yield client, new["sessionId"]


def rows(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    kinds = ("tool_call", "tool_call_update")
    return [u for u in client.updates(sid) if u["sessionUpdate"] in kinds]


def texts(update: dict[str, Any]) -> list[str]:
    return [
        block["content"]["text"]
        for block in update.get("content") or ()
        if block.get("type") == "content"
    ]


def final_row(client: AcpTestClient, sid: str) -> dict[str, Any] | None:
    ended = [r for r in rows(client, sid) if r.get("status") in ("completed", "failed")]
    return ended[-1] if ended else None


@pytest.mark.parametrize("version", [1, 2])
async def test_a_failed_command_shows_its_exit_code_in_its_row_text(
    both: Harness,
    project: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with session(both, project, version) as (client, sid):
        await client.prompt(sid, "/tool shell " + json.dumps({"command": "echo oops; exit 3"}))
        with trio.fail_after(10):
            await client.wait_until(lambda: final_row(client, sid) is not None)
        row = final_row(client, sid)
        assert row is not None
        assert row["status"] == "failed"
        assert row["rawOutput"]["exitCode"] == 3
        (text,) = texts(row)
        assert text.splitlines()[0] == "exit code 3"
        client.validate(acp_schema_v2 if version == 2 else acp_schema)


@pytest.mark.parametrize("version", [1, 2])
async def test_a_failed_background_command_shows_its_exit_code_in_its_final_row(
    both: Harness,
    project: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with session(both, project, version) as (client, sid):
        await client.prompt(sid, "/bg exit 4")
        with trio.fail_after(10):
            await client.wait_until(lambda: final_row(client, sid) is not None)
        row = final_row(client, sid)
        assert row is not None
        assert row["status"] == "failed"
        assert row["rawOutput"]["exitCode"] == 4
        (text,) = texts(row)
        assert text.splitlines()[0] == "exit code 4"
        client.validate(acp_schema_v2 if version == 2 else acp_schema)
