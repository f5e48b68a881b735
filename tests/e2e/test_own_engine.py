"""``examples/own_engine.py``: a host with an engine of its own, started by its documented
command and driven through the real connector (``maple-acp acp``) as an ACP client would."""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from maple_acp.testing.schema import AcpSchema

from .host_processes import (
    DEADLINE,
    MAPLE_ACP,
    LineReader,
    assert_only_protocol_lines,
    clean_env,
    connector_client,
    example_command,
    serving_process,
)

EXAMPLE = "own_engine.py"
READY = "own engine: serving on "


@asynccontextmanager
async def own_engine(socket_path: Path, data_dir: Path) -> AsyncIterator[LineReader]:
    """The example running as its own process until the block ends; then SIGINT, and it must
    stop cleanly."""
    async with serving_process(
        example_command(EXAMPLE, socket_path, data_dir),
        env=clean_env(),
        ready=lambda line: line.startswith(READY),
        stop_signal=signal.SIGINT,
    ) as (host, stderr):
        yield stderr
    assert host.returncode == 0, stderr.text
    assert stderr.lines[-1] == "own engine: stopped", stderr.text
    assert not any("Traceback" in line for line in stderr.lines), stderr.text


def of_kind(updates: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [u for u in updates if u["sessionUpdate"] == kind]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_own_engine_answers_notes_and_remembers(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    base = short_dir / "own"
    socket_path, data_dir = base / "run" / "acp.sock", base / "data"
    decisions: list[str] = []

    def permission(params: Mapping[str, Any]) -> str:
        return decisions.pop(0)

    with trio.fail_after(DEADLINE):
        async with (
            own_engine(socket_path, data_dir),
            # The command an ACP client runs: ``maple-acp acp``, not the connector module.
            connector_client(
                socket_path, command=[*MAPLE_ACP, "acp"], permission=permission
            ) as connector,
        ):
            args = connector.process.args
            assert isinstance(args, list)
            assert args[2:4] == ["maple_acp._main", "acp"]
            # Every directory the example made is private.
            assert [mode(d) for d in (base, base / "run", data_dir)] == [0o700] * 3
            client = connector.client
            await client.initialize()
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            await client.wait_until(
                lambda: bool(of_kind(client.updates(sid), "available_commands_update"))
            )
            [commands] = of_kind(client.updates(sid), "available_commands_update")
            assert [c["name"] for c in commands["availableCommands"]] == ["note", "again"]

            answer = await client.prompt(sid, "What is ACP?")
            assert answer["stopReason"] == "end_turn"
            assert client.text(sid).startswith("The Agent Client Protocol")
            assert client.text(sid, "agent_thought_chunk") == "found 'what is acp' in the table"

            # The engine's own tool: the client sees the diff and the file, then is asked.
            decisions.append("allow")
            before = len(client.updates(sid))
            await client.prompt(sid, "/note buy milk")
            notes = project / "NOTES.md"
            assert notes.read_text() == "- buy milk\n"
            rows = [u for u in client.updates(sid)[before:] if "toolCallId" in u]
            assert rows[0]["sessionUpdate"] == "tool_call"
            final = rows[-1]
            assert final["status"] == "completed"
            [diff] = [c for c in final["content"] if c["type"] == "diff"]
            assert diff["path"] == os.fspath(notes)
            assert diff["newText"] == "- buy milk\n"
            assert diff.get("oldText") is None
            assert [loc["path"] for loc in final["locations"]] == [os.fspath(notes)]
            assert len(client.permission_requests) == 1

            decisions.append("reject")
            await client.prompt(sid, "/note sell the cow")
            assert notes.read_text() == "- buy milk\n"
            assert client.text(sid).endswith("NOTES.md is unchanged.")

            # The engine reads the conversation so far.
            await client.prompt(sid, "who are you")
            await client.prompt(sid, "/again")
            assert client.text(sid).endswith(
                "A lookup table that speaks ACP.A lookup table that speaks ACP."
            )
            await client.prompt(sid, "what is the time")
            assert client.text(sid).endswith("who are you?")

            # A NOTES.md that leads out of the project is neither read nor written.
            outside = short_dir / "outside.md"
            outside.write_text("private\n")
            notes.unlink()
            notes.symlink_to(outside)
            await client.prompt(sid, "/note leak")
            assert client.text(sid).endswith("outside the session's project directory")
            assert outside.read_text() == "private\n"
            assert "private" not in json.dumps(client.updates(sid))
            assert len(client.permission_requests) == 2

            client.validate(acp_schema)
            assert_only_protocol_lines(client)
        assert connector.process.returncode == 0
    assert not socket_path.exists()


async def test_own_engine_refuses_a_shared_socket_directory_in_one_line(
    short_dir: Path,
) -> None:
    shared = short_dir / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    command = example_command(EXAMPLE, shared / "acp.sock", short_dir / "d")
    with trio.fail_after(DEADLINE):
        result = await trio.run_process(
            command, capture_stdout=True, capture_stderr=True, check=False, env=clean_env()
        )
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("own engine: ")
    assert os.fspath(shared) in lines[0]
