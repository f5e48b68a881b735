"""Interop: the TypeScript SDK 2.4.0's experimental ACP v2 client offers a tool that lives in
the client, served by the SDK's own MCP-over-ACP provider, to a real ``maple-acp serve`` through
``maple-acp acp`` (the stdio connector); the demo calls it. The SDK checks every frame it
receives, the host's ``mcp/message`` requests among them."""

from __future__ import annotations

import json
from pathlib import Path

from .host_processes import MAPLE_ACP, running_host
from .interop_clients import beside_sdk, client_report

SCRIPT: Path = Path(__file__).parent / "interop" / "mcp_client_tools.mjs"
#: The whole scripted session finishes well within this.
DEADLINE_S: float = 120.0


async def test_the_typescript_sdks_provider_offers_a_tool_through_the_connector(
    tmp_path: Path, ts_sdk: Path
) -> None:
    script = beside_sdk(ts_sdk, SCRIPT)
    project = tmp_path / "project"
    project.mkdir()
    async with running_host(tmp_path) as host:
        acp_command = [*MAPLE_ACP, "acp", "--socket", str(host.socket)]
        report = await client_report(
            ["node", str(script), *acp_command, str(project.resolve())], DEADLINE_S
        )
    print("MCP-over-ACP interop:", json.dumps(report))
    assert report["acp"] == {}
    # The provider refuses the handshake before its handler sees it; the host discovers the
    # server instead, before the session's answer.
    assert report["setUp"] == ["server/discover", "tools/list"]
    methods = [call["method"] for call in report["inner"]]
    assert methods == ["server/discover", "tools/list", "tools/call"]
    assert {call["version"] for call in report["inner"]} == {"2026-07-28"}
    call = report["inner"][-1]
    assert call["meta"] == {
        "maple.sessionId": report["sessionId"],
        "maple.toolCallId": report["toolCallId"],
    }
    assert report["status"] == "completed"
    assert report["rawOutput"]["content"] == [{"type": "text", "text": "client clock"}]
