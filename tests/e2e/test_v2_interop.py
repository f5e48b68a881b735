"""Interop: the TypeScript SDK 2.4.0's experimental ACP v2 client drives ``maple-acp acp``
against a real ``maple-acp serve`` (which offers v2). The SDK is installed from the npm
registry once into pytest's cache folder; the SDK checks every frame it receives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from .host_processes import clean_env, running_host

#: The SDK whose ``/experimental/v2`` client speaks the draft this agent implements.
SDK: str = "@agentclientprotocol/sdk@2.4.0"
SCRIPT: Path = Path(__file__).parent / "interop" / "v2_client.mjs"
#: npm install and the whole scripted session each finish well within this.
DEADLINE_S: float = 180.0


def _sdk_dir(config: pytest.Config, fallback: Path) -> Path:
    """pytest's own cache folder (kept between runs, ignored by git), else a scratch one."""
    cache = getattr(config, "cache", None)
    return Path(cache.mkdir("acp-sdk-2.4.0")) if cache is not None else fallback


def _install_sdk(directory: Path) -> Path:
    if not (directory / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(directory), SDK],
            check=True,
            capture_output=True,
            timeout=DEADLINE_S,
        )
    # ES modules resolve packages from the script's own folder: the script sits beside them.
    shutil.copyfile(SCRIPT, directory / SCRIPT.name)
    return directory / SCRIPT.name


async def test_typescript_v2_client_drives_maple_acp_acp(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed for the ACP v2 interop test")
        pytest.skip("node and npm are not on this machine")
    directory = _sdk_dir(pytestconfig, tmp_path / "npm")
    script = await trio.to_thread.run_sync(_install_sdk, directory)
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
    assert report["child"] == {
        "title": "Survey",
        "text": "working on: list the filesanswer: list the files",
        "askedWithItsId": True,
        "messages": [["parent", "list the files"], ["child", "answer: list the files"]],
        "replayed": 1,
    }
    assert report["replayed"] == 3
    assert report["listed"] is True
