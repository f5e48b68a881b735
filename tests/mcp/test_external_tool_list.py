"""The backend sees one static ``external_mcp`` tool for a session's MCP servers, never their
own tools, and nothing once the session ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from acp_support import Loopback, acp_http_server

from maple_acp.backends.demo import DemoBackend
from maple_acp.runtime import Turn
from maple_acp.testing.service import running_demo_acp


class RecordingBackend(DemoBackend):
    """The demo backend, noting which extra tools each turn was given."""

    def __init__(self) -> None:
        self.seen: list[list[dict[str, Any]]] = []

    async def run_turn(self, turn: Turn) -> None:
        self.seen.append(
            [
                {"name": t.name, "schema": t.input_schema, "description": t.description}
                for t in turn.tools.external_tools
            ]
        )
        await super().run_turn(turn)


@pytest.fixture
def loopback(loopback_ports: dict[str, int]) -> Loopback:
    return Loopback(loopback_ports)


async def test_one_static_tool_and_no_raw_server_tools(
    tmp_path: Path, loopback: Loopback, tag: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    backend = RecordingBackend()
    server = acp_http_server(loopback.url(), tag=tag)
    async with (
        running_demo_acp(tmp_path, backend=backend) as harness,
        harness.connect() as client,
    ):
        with_mcp = (await client.new_session(str(project), mcp_servers=[server]))["sessionId"]
        await client.prompt(with_mcp, "hello")
        plain = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(plain, "hello")
    tools, none = backend.seen
    assert none == []
    [tool] = tools
    assert tool["name"] == "external_mcp"
    schema = tool["schema"]
    assert schema["required"] == ["tool", "arguments"]
    assert schema["additionalProperties"] is False
    assert "oneOf" not in str(schema)
    ids = schema["properties"]["tool"]["enum"]
    assert ids
    assert all(i.startswith("main__") for i in ids)
    # The servers' own tools are described inside the one tool, never offered as tools.
    assert all(i.split("__", 1)[1] in tool["description"] for i in ids)
