"""Interop: the TypeScript SDK 2.4.0's experimental ACP v2 client drives ``maple-acp acp``
against a real ``maple-acp serve`` (which offers v2). The SDK is installed from the npm
registry once into pytest's cache folder (``interop_clients``); it checks every frame it
receives."""

from __future__ import annotations

import json
from pathlib import Path

from .interop_clients import connector_report

SCRIPT: Path = Path(__file__).parent / "interop" / "v2_client.mjs"
#: The whole scripted session finishes well within this; it only bounds a hang.
DEADLINE_S: float = 180.0


async def test_typescript_v2_client_drives_maple_acp_acp(tmp_path: Path, ts_sdk: Path) -> None:
    report, project = await connector_report(tmp_path, ts_sdk, SCRIPT, DEADLINE_S)
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
