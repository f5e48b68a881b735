"""Session modes, and additional directories, over the real socket: each mode chosen by
``session/set_mode`` or the ``mode`` config option, announced with ``current_mode_update``,
enforced on the demo's ``write_file`` and restored on load; ``additionalDirectories`` admitted,
stored, compared on load and reachable by the file tools. Every frame is checked against the
1.29 schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.runtime import MAX_ADDITIONAL_DIRECTORIES
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError


async def _code(call: Any) -> int:
    with pytest.raises(ProtocolError) as info:
        await call
    return info.value.code


def _write(path: Path, text: str = "hi") -> str:
    return "/tool write_file " + json.dumps({"path": str(path), "content": text})


def _last_tool_status(client: AcpTestClient, sid: str) -> str:
    rows = [u for u in client.updates(sid) if u["sessionUpdate"].startswith("tool_call")]
    return str(rows[-1]["status"])


async def _choose(client: AcpTestClient, sid: str, mode: str, via_option: bool) -> None:
    if via_option:
        answer = await client.call(
            "session/set_config_option", {"sessionId": sid, "configId": "mode", "value": mode}
        )
        [option] = [o for o in answer["configOptions"] if o["id"] == "mode"]
        assert option["currentValue"] == mode
    else:
        assert await client.call("session/set_mode", {"sessionId": sid, "modeId": mode}) == {}
    await client.wait_until(
        lambda: any(
            u["sessionUpdate"] == "current_mode_update" and u["currentModeId"] == mode
            for u in client.updates(sid)
        )
    )


@pytest.mark.parametrize("via_option", [False, True], ids=["set_mode", "config_option"])
async def test_each_mode_is_chosen_announced_enforced_and_restored(
    harness: Harness, project: Path, acp_schema: AcpSchema, via_option: bool
) -> None:
    async with harness.connect() as client:
        new = await client.new_session(str(project))
        sid = new["sessionId"]
        assert [m["id"] for m in new["modes"]["availableModes"]] == [
            "ask",
            "code",
            "plan",
            "auto-edit",
        ]
        assert all(m["name"] and m["description"] for m in new["modes"]["availableModes"])

        await _choose(client, sid, "ask", via_option)
        await client.prompt(sid, _write(project / "ask.txt"))
        assert _last_tool_status(client, sid) == "failed"
        assert not client.permission_requests
        assert not (project / "ask.txt").exists()

        await _choose(client, sid, "auto-edit", via_option)
        await client.prompt(sid, _write(project / "auto.txt"))
        assert (project / "auto.txt").read_text() == "hi"
        assert not client.permission_requests

        await _choose(client, sid, "code", via_option)
        await client.prompt(sid, _write(project / "code.txt"))
        assert len(client.permission_requests) == 1
        assert (project / "code.txt").read_text() == "hi"

        await _choose(client, sid, "plan", via_option)
        # Unknown modes change nothing.
        assert await _code(client.call("session/set_mode", {"sessionId": sid, "modeId": "x"})) == (
            -32602
        )
        params = {"sessionId": sid, "configId": "mode", "value": "x"}
        assert await _code(client.call("session/set_config_option", params)) == -32602
        await client.close_session(sid)
        client.validate(acp_schema)
    async with harness.connect() as client:
        loaded = await client.load_session(sid, str(project))
        assert loaded["modes"]["currentModeId"] == "plan"
        assert len(loaded["modes"]["availableModes"]) == 4
        [option] = [o for o in loaded["configOptions"] if o["id"] == "mode"]
        assert option["currentValue"] == "plan"
        # The demo model has no thinking levels: no thought_level option.
        assert "thought_level" not in {o["id"] for o in loaded["configOptions"]}
        assert "current_mode_update" not in {u["sessionUpdate"] for u in client.updates(sid)}
        client.validate(acp_schema)


async def test_additional_directories_are_admitted_stored_compared_and_writable(
    harness: Harness, project: Path, tmp_path: Path, acp_schema: AcpSchema
) -> None:
    extras = [tmp_path / f"extra{n}" for n in range(MAX_ADDITIONAL_DIRECTORIES + 1)]
    for extra in extras:
        extra.mkdir()
    names = [str(e) for e in extras]
    async with harness.connect() as client:
        for bad in (names, ["relative/dir"], [str(tmp_path / "missing")]):
            call = client.new_session(str(project), additionalDirectories=bad)
            assert await _code(call) == -32602
        sid = (await client.new_session(str(project), additionalDirectories=names[:2]))["sessionId"]
        await client.prompt(sid, _write(extras[1] / "inside.txt", "there"))
        assert (extras[1] / "inside.txt").read_text() == "there"
        await client.close_session(sid)
        client.validate(acp_schema)
    async with harness.connect() as client:
        load = {"sessionId": sid, "cwd": str(project), "mcpServers": []}
        for other in ([], names[:1], names[1:3]):
            call = client.call("session/load", {**load, "additionalDirectories": other})
            assert await _code(call) == -32602
        await client.call("session/load", {**load, "additionalDirectories": names[1::-1]})
        [listed] = (await client.list_sessions())["sessions"]
        assert len(listed["additionalDirectories"]) == 2
        client.validate(acp_schema)


async def test_additional_directories_outside_the_allowed_roots_are_refused(
    tmp_path: Path,
) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "repo").mkdir(parents=True)
    (allowed / "more").mkdir()
    config = AcpServiceConfig(allowed_roots=(str(allowed),))
    async with running_service(tmp_path, config=config) as running, running.connect() as client:
        repo = str(allowed / "repo")
        call = client.new_session(repo, additionalDirectories=[str(tmp_path)])
        assert await _code(call) == -32602
        assert (await client.new_session(repo, additionalDirectories=[str(allowed / "more")]))[
            "sessionId"
        ]
