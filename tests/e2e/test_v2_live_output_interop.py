"""Interop: the TypeScript SDK 2.4.0's experimental ACP v2 client follows a command's live
output through ``maple-acp acp`` against a real ``maple-acp serve``: terminal updates and
output chunks as alpha.12 shapes them, a failing command's exit status, output past the
tail replaced then appended to, a background command's row to its end, and a Markdown plan.
The SDK parses every frame it receives; every frame the agent sent is also checked here
against the v2 schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maple_acp.runtime import LIVE_TAIL_CHARS
from maple_acp.testing.schema import AcpSchema, validate_frames

from .interop_clients import connector_report

SCRIPT: Path = Path(__file__).parent / "interop" / "v2_live_output_client.mjs"
#: The whole scripted session finishes well within this; it only bounds a hang.
DEADLINE_S: float = 60.0
#: The first command prints a line every quarter second: 1 to 3 per 100 ms publishing tick.
LIVE_COMMAND: str = "for i in 1 2 3; do echo line$i; sleep 0.25; done"


def _terminal_checks(seen: dict[str, Any], output: str, exit_code: int, row: str) -> None:
    """One tool call's terminal as the client saw it."""
    assert seen["kinds"][0] == "terminal_update"
    # Announced, then shown on the call, before any output.
    assert seen["openedAt"] < seen["firstChunkAt"]
    assert seen["shownAt"] < seen["firstChunkAt"]
    # Every chunk in order, nothing lost or repeated.
    assert "".join(seen["chunks"]) == output
    assert seen["kinds"][-1] == "terminal_update"
    assert seen["exitStatus"] == {"exitCode": exit_code}
    assert seen["statuses"][-1] == row
    assert seen["lastContent"][0]["type"] == "terminal"


async def test_typescript_v2_client_follows_live_output_background_and_plan(
    tmp_path: Path, ts_sdk: Path, acp_schema_v2: AcpSchema
) -> None:
    report, project = await connector_report(tmp_path, ts_sdk, SCRIPT, DEADLINE_S)
    frames = [(direction, message) for direction, message in report.pop("frames")]
    assert report["protocolVersion"] == 2
    assert validate_frames(acp_schema_v2, frames) > 30
    assert report["sdkAltered"] == []

    live = report["live"]
    assert live["opened"]["command"] == LIVE_COMMAND
    assert live["opened"]["cwd"] == str(project)
    _terminal_checks(live, "line1\nline2\nline3\n", 0, "completed")
    # Streamed while it ran, not all at its exit.
    assert len(live["chunks"]) >= 2

    _terminal_checks(report["failing"], "oops\n", 3, "failed")

    # 100,000 characters at once: more than the tail, so the terminal's output is replaced
    # by the tail, and what follows is appended to it.
    flood = report["flood"]
    assert flood["replaced"] >= 1
    assert flood["allX"] is True
    assert flood["shownEnd"] == "x\nend\n"
    assert LIVE_TAIL_CHARS <= flood["shownLength"] < 100_000
    assert flood["exitStatus"] == {"exitCode": 0}

    background = report["background"]
    handle = report["bgText"].removeprefix("started ")
    assert handle.startswith("bg-")
    # The turn ended with the command still running; its row went on to its end.
    assert report["bgAtTurnEnd"] == "in_progress"
    _terminal_checks(background, "bg1\nbg2\n", 0, "completed")
    assert report["backgroundList"]["commands"] == [
        {
            "handle": handle,
            "command": "echo bg1; sleep 0.5; echo bg2",
            "status": "exited",
            "exitCode": 0,
        }
    ]

    terminals = (live, report["failing"], background)
    checked = sum(len(seen["kinds"]) for seen in terminals) + flood["kinds"]
    assert report["sdkParsed"] == checked + len(report["plans"])
    # A Markdown plan: one plan_update, replaced whole, with the session's plan id.
    assert report["plans"] == [
        {"type": "markdown", "planId": "plan", "content": "# Steps\n- [x] build\n- [ ] ship"}
    ]
    print("live chunks at (ms):", live["chunkTimes"], "exit at:", live["exitAt"], "flood:", flood)
