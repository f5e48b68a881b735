"""``maple-acp sessions list/show/delete``: ACP clients of a real running host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from maple_acp.backends.demo import DEMO_MODELS
from maple_acp.listeners import UnixListener
from maple_acp.runtime import StaticModelCatalog
from maple_acp.testing.service import running_demo_acp
from maple_acp.wire import ProtocolError

from .host_processes import (
    DEADLINE,
    MAPLE_ACP,
    Host,
    connector_client,
    run_command,
    running_host,
)


async def cli(host: Host, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*MAPLE_ACP, *args, "--socket", os.fspath(host.socket)]
    return await trio.to_thread.run_sync(run_command, command)


async def make_session(host: Host, cwd: Path, *prompts: str) -> str:
    async with connector_client(host.socket) as connector:
        client = connector.client
        await client.initialize()
        session_id: str = (await client.new_session(os.fspath(cwd)))["sessionId"]
        for prompt in prompts:
            await client.prompt(session_id, prompt)
        await client.close_session(session_id)
    return session_id


async def while_open_elsewhere(
    host: Host, cwd: Path, *command: str
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run ``maple-acp sessions <command> ID`` while another client holds session ID open
    (after a prompt); returns the ID and what the command did."""
    async with connector_client(host.socket) as connector:
        client = connector.client
        await client.initialize()
        session_id: str = (await client.new_session(os.fspath(cwd)))["sessionId"]
        await client.prompt(session_id, "busy elsewhere")
        return session_id, await cli(host, "sessions", *command, session_id)


async def test_list_shows_every_session_and_filters_by_cwd(short_dir: Path) -> None:
    first, second = short_dir / "one", short_dir / "two"
    first.mkdir()
    second.mkdir()
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            a = await make_session(host, first, "/title First task\nhello")
            b = await make_session(host, second, "hello two")
            listed = await cli(host, "sessions", "list")
            assert listed.returncode == 0, listed.stderr
            lines = listed.stdout.splitlines()
            assert len(lines) == 2
            line_a = next(line for line in lines if line.startswith(a))
            assert os.fspath(first) in line_a
            assert line_a.endswith("First task")
            assert any(line.startswith(b) for line in lines)

            as_json = await cli(host, "sessions", "list", "--json", "--cwd", os.fspath(second))
            assert as_json.returncode == 0, as_json.stderr
            sessions = json.loads(as_json.stdout)["sessions"]
            assert [s["sessionId"] for s in sessions] == [b]
            assert sessions[0]["cwd"] == os.fspath(second)


async def test_list_on_an_empty_host_says_so(short_dir: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            listed = await cli(host, "sessions", "list")
            assert (listed.returncode, listed.stdout) == (0, "no sessions\n")
            as_json = await cli(host, "sessions", "list", "--json")
            assert json.loads(as_json.stdout) == {"sessions": []}


async def test_show_prints_a_readable_transcript_and_releases_the_session(
    project: Path, short_dir: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            session_id = await make_session(
                host,
                project,
                "/think pondering\nhello there\n/echo second line",
                '/tool shell {"command": "echo from-the-tool"}',
                "escape \x1b[31mred",
            )
            shown = await cli(host, "sessions", "show", session_id)
            assert shown.returncode == 0, shown.stderr
            out = shown.stdout
            assert out.startswith(f"session {session_id}")
            assert f"cwd {project}" in out
            for expected in (
                "user:\n  /think pondering\n  hello there",
                "thought:\n  pondering",
                "agent:\n  hello there",
                "tool: shell: echo from-the-tool [completed]",
                "  from-the-tool",
            ):
                assert expected in out, out
            # A transcript cannot drive the terminal: the escape byte is shown, not sent.
            assert "\x1b" not in out
            assert "\\x1b[31mred" in out
            # show opened nothing: another client can open the session at once.
            async with connector_client(host.socket) as connector:
                await connector.client.initialize()
                await connector.client.load_session(session_id, os.fspath(project))


async def test_show_reads_a_session_open_elsewhere_and_refuses_an_unknown_id(
    project: Path, short_dir: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            # Read only: the session is not opened, so its holder keeps it.
            _, shown = await while_open_elsewhere(host, project, "show")
            assert shown.returncode == 0, shown.stderr
            assert "user:\n  busy elsewhere" in shown.stdout
            unknown = await cli(host, "sessions", "show", "no-such-id")
            assert unknown.returncode == 1
            assert unknown.stderr == (
                "maple-acp: no session 'no-such-id' on this host (see: maple-acp sessions list)\n"
            )


async def test_delete_removes_the_session_for_good(project: Path, short_dir: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as connector:
                caps = (await connector.client.initialize())["agentCapabilities"]
            assert "delete" in caps["sessionCapabilities"]  # serve allows deleting
            keep = await make_session(host, project, "keep me")
            gone = await make_session(host, project, "delete me")
            deleted = await cli(host, "sessions", "delete", gone)
            assert deleted.returncode == 0, deleted.stderr
            assert deleted.stdout == f"deleted session {gone}\n"
            listed = await cli(host, "sessions", "list", "--json")
            assert [s["sessionId"] for s in json.loads(listed.stdout)["sessions"]] == [keep]
            # Delete is idempotent (ACP's rule; no existence oracle): a second one succeeds too.
            again = await cli(host, "sessions", "delete", gone)
            assert again.returncode == 0, again.stderr


async def test_delete_refuses_a_session_open_elsewhere(project: Path, short_dir: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            session_id, refused = await while_open_elsewhere(host, project, "delete")
            assert refused.returncode == 1
            assert refused.stderr.startswith(f"maple-acp: cannot delete session {session_id}")
            assert refused.stderr.count("\n") == 1
            listed = await cli(host, "sessions", "list", "--json")
            assert [s["sessionId"] for s in json.loads(listed.stdout)["sessions"]] == [session_id]


async def test_show_needs_no_model_a_session_whose_model_left_the_catalog(
    project: Path, short_dir: Path
) -> None:
    """A session locked to a model the host no longer offers cannot be loaded (never
    substituted), but ``sessions show`` prints it: reading needs no model."""
    with trio.fail_after(DEADLINE):
        async with running_demo_acp(short_dir) as harness, harness.connect() as client:
            await client.initialize()
            session_id = (await client.new_session(os.fspath(project)))["sessionId"]
            await client.call(
                "session/set_config_option",
                {"sessionId": session_id, "configId": "model", "value": "demo-echo-large"},
            )
            await client.prompt(session_id, "/echo from the large model")
            await client.close_session(session_id)
        remaining = StaticModelCatalog(tuple(m for m in DEMO_MODELS if m.id != "demo-echo-large"))
        socket = short_dir / "run" / "acp.sock"
        async with (
            running_demo_acp(short_dir, catalog=remaining) as harness,
            trio.open_nursery() as nursery,
        ):
            await harness.acp.start(nursery, UnixListener(socket))
            async with harness.connect() as client:
                await client.initialize()
                with pytest.raises(ProtocolError) as refused:
                    await client.load_session(session_id, os.fspath(project))
                assert "no longer offered" in refused.value.message
            command = [*MAPLE_ACP, "sessions", "show", session_id, "--socket", os.fspath(socket)]
            shown = await trio.to_thread.run_sync(run_command, command)
            await harness.acp.stop(persist=False)
    assert shown.returncode == 0, shown.stderr
    assert "agent:\n  from the large model" in shown.stdout
