"""Interop: the TypeScript SDK 2.4.0's experimental ACP v2 client drives ``maple-acp acp``
against a real ``maple-acp serve`` (which offers v2). The SDK is installed from the npm
registry once into pytest's cache folder; the SDK checks every frame it receives."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from .host_processes import clean_env, running_host
from .npm_sdk import require_node, sdk_script

SCRIPT: Path = Path(__file__).parent / "interop" / "v2_client.mjs"
#: The whole scripted session finishes well within this.
DEADLINE_S: float = 180.0


async def test_typescript_v2_client_drives_maple_acp_acp(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    require_node("the ACP v2 interop test")
    script = await sdk_script(pytestconfig, tmp_path / "npm", SCRIPT)
    project = tmp_path / "project"
    project.mkdir()
    async with running_host(tmp_path) as host:
        acp_command = [sys.executable, "-m", "maple_acp._main", "acp", "--socket", str(host.socket)]
        with trio.fail_after(DEADLINE_S):
            result = await trio.run_process(
                ["node", str(script), *acp_command, str(project.resolve())],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=clean_env(),
            )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    report = json.loads(result.stdout.decode().strip().splitlines()[-1])
    print("v2 interop:", json.dumps(report))
    assert report["protocolVersion"] == 2
    assert report["messageId"]
    assert report["streamed"] == 1000
    assert report["permissions"] == [
        {"title": report["permissions"][0]["title"], "subject": "tool_call"}
    ]
    assert (project / "interop-marker").exists()
    assert report["states"] == [
        "running",
        "idle:end_turn",
        "running",
        "requires_action",
        "running",
        "idle:end_turn",
    ]
    assert report["toolKinds"] == ["tool_call_update"]
    assert report["replayed"] == 2
    assert report["listed"] is True
