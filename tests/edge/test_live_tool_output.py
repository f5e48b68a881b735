"""Live tool output and background commands, through the wire (v1 and v2): the shell tool's
bounded tail while the command runs, a failure's exit code, v2's terminal updates checked
against the schema, a client that stops reading, and background commands that outlive their
turn but never their session (real subprocesses: their pids are checked)."""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service
from line_client import LineClient as BaseLineClient
from line_client import socket_pair_for

from maple_acp.edge import CLOSE_DEADLINE_S, AcpServiceConfig
from maple_acp.runtime import LIVE_TAIL_CHARS, MAX_BACKGROUND_COMMANDS, AskForTools
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

#: ``seq 1 SEQ_LINES`` prints about 10 MB.
SEQ_LINES = 1_500_000
SEQ_OUTPUT = "".join(f"{n}\n" for n in range(1, SEQ_LINES + 1))
#: Snapshots of a command that prints for well under a few seconds, at most: one per 100 ms,
#: with a wide margin for a loaded machine, and nowhere near one per pipe read (160 of them).
MAX_SNAPSHOTS = 60
#: Host memory may grow by at most this much while a client that stopped reading is shown a
#: 10 MB command's output.
MEMORY_BOUND = 4 * 1024 * 1024


def shell(command: str) -> str:
    return "/tool shell " + json.dumps({"command": command})


def tool_updates(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    kinds = ("tool_call", "tool_call_update")
    return [u for u in client.updates(sid) if u["sessionUpdate"] in kinds]


def texts(update: dict[str, Any]) -> list[str]:
    return [
        block["content"]["text"]
        for block in update.get("content") or ()
        if block.get("type") == "content"
    ]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def background_pid(client: AcpTestClient, sid: str, handle: str = "bg-1") -> int:
    """Start ``echo $$; exec sleep 60`` in the background and read its pid off the live row."""
    answer = await client.prompt(sid, "/bg echo $$; exec sleep 60")
    assert answer["stopReason"] == "end_turn"
    started = [u for u in tool_updates(client, sid) if texts(u) == [handle]]
    assert started
    assert started[-1]["status"] == "in_progress"
    tool_id = started[-1]["toolCallId"]

    def printed() -> list[str]:
        return [
            text.strip()
            for u in tool_updates(client, sid)
            if u["toolCallId"] == tool_id
            for text in texts(u)
            if text.strip().isdigit()
        ]

    with trio.fail_after(10):
        await client.wait_until(lambda: bool(printed()))
    pid = int(printed()[0])
    assert alive(pid)
    return pid


async def listing(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    answer = await client.call("_session/background", {"sessionId": sid, "action": "list"})
    return list(answer["commands"])


async def test_v1_shows_the_last_16000_characters_a_few_times_a_second(
    harness: Harness, project: Path
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, shell(f"seq 1 {SEQ_LINES}"))
        assert answer["stopReason"] == "end_turn"
        updates = tool_updates(client, sid)
        live = [u for u in updates if u.get("status") == "in_progress" and texts(u)]
        assert live, "no live output reached the client"
        assert len(updates) <= MAX_SNAPSHOTS, len(updates)
        for update in live:
            (text,) = texts(update)
            # Each snapshot is the tail of what was printed so far: whole, never marked.
            assert len(text) <= LIVE_TAIL_CHARS
            assert text in SEQ_OUTPUT
        final = updates[-1]
        assert final["status"] == "completed"
        assert texts(final) == [SEQ_OUTPUT[-LIVE_TAIL_CHARS:]]
        assert final["rawOutput"]["exitCode"] == 0


async def test_a_failed_command_says_its_exit_code_in_its_text(
    harness: Harness, project: Path
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, shell("echo oops; exit 3"))
        final = tool_updates(client, sid)[-1]
        assert final["status"] == "failed"
        assert texts(final) == ["exit code 3\noops\n"]
        assert final["rawOutput"]["exitCode"] == 3


@pytest.fixture
async def v2_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    config = AcpServiceConfig(protocol_max=2, allow_session_delete=True)
    async with running_service(tmp_path, config=config) as running:
        yield running


async def v2_session(client: AcpTestClient, project: Path) -> str:
    init = {"protocolVersion": 2, "info": {"name": "t", "version": "0"}, "capabilities": {}}
    assert (await client.call("initialize", init))["protocolVersion"] == 2
    return str((await client.call("session/new", {"cwd": str(project)}))["sessionId"])


async def v2_idle(client: AcpTestClient, sid: str, count: int = 1) -> None:
    def idle() -> int:
        return sum(
            u["sessionUpdate"] == "state_update" and u["state"] == "idle"
            for u in client.updates(sid)
        )

    with trio.fail_after(10):
        await client.wait_until(lambda: idle() >= count)


def terminal_frames(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    kinds = ("terminal_update", "terminal_output_chunk")
    return [u for u in client.updates(sid) if u["sessionUpdate"] in kinds]


async def test_v2_sends_terminal_updates_and_chunks_as_alpha_12_shapes_them(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_harness.connect() as client:
        sid = await v2_session(client, project)
        await client.prompt(sid, shell("for i in 1 2 3; do echo line $i; sleep 0.15; done; exit 2"))
        await v2_idle(client, sid)
        frames = terminal_frames(client, sid)
        first = frames[0]
        assert first["sessionUpdate"] == "terminal_update"
        assert first["command"].startswith("for i in")
        assert first["cwd"] == str(project)
        terminal = first["terminalId"]
        assert all(frame["terminalId"] == terminal for frame in frames)
        printed = b"".join(
            base64.b64decode(f["data"])
            for f in frames
            if f["sessionUpdate"] == "terminal_output_chunk"
        )
        assert printed == b"line 1\nline 2\nline 3\n"
        last = frames[-1]
        assert last["sessionUpdate"] == "terminal_update"
        assert last["exitStatus"] == {"exitCode": 2}
        rows = [u for u in client.updates(sid) if u["sessionUpdate"] == "tool_call_update"]
        assert {"type": "terminal", "terminalId": terminal} in rows[-1]["content"]
        assert rows[-1]["status"] == "failed"
        # Ordered: the terminal is announced before the call shows it and before any output.
        updates = client.updates(sid)
        shown = next(
            i
            for i, u in enumerate(updates)
            if u["sessionUpdate"] == "tool_call_update"
            and {"type": "terminal", "terminalId": terminal} in (u.get("content") or ())
        )
        assert updates.index(first) < shown
        assert client.validate(acp_schema_v2) > 0


async def test_v2_background_command_is_a_terminal_that_ends_with_its_status(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_harness.connect() as client:
        sid = await v2_session(client, project)
        await client.prompt(sid, "/bg echo started; exec sleep 60")
        await v2_idle(client, sid)
        with trio.fail_after(10):
            await client.wait_until(lambda: bool(terminal_frames(client, sid)[1:]))
        await client.call(
            "_session/background", {"sessionId": sid, "action": "stop", "handle": "bg-1"}
        )
        with trio.fail_after(10):
            await client.wait_until(lambda: "exitStatus" in terminal_frames(client, sid)[-1])
        assert terminal_frames(client, sid)[-1]["exitStatus"] == {
            "exitCode": None,
            "signal": "SIGTERM",
        }
        with trio.fail_after(10):
            await client.wait_until(lambda: tool_updates(client, sid)[-1].get("status") == "failed")
        # Its final row is stored: a resume from the start replays it with what it printed.
        await client.call("session/close", {"sessionId": sid})
        seen = len(tool_updates(client, sid))
        resume = {"sessionId": sid, "cwd": str(project), "replayFrom": {"type": "start"}}
        await client.call("session/resume", resume)
        replayed = tool_updates(client, sid)[seen:]
        (row,) = [u for u in replayed if (u.get("rawOutput") or {}).get("handle") == "bg-1"]
        assert row["status"] == "failed"
        assert texts(row) == ["killed by SIGTERM\nstarted\n"]
        # Its raw output has a foreground command's shape, besides its handle and command.
        assert row["rawOutput"] == {
            "exitCode": -15,
            "output": "started\n",
            "truncated": False,
            "handle": "bg-1",
            "command": "echo started; exec sleep 60",
        }
        assert client.validate(acp_schema_v2) > 0


class LineClient(BaseLineClient):
    """The raw client, keeping the updates it reads on the way to an answer."""

    async def answer(self, request_id: int) -> tuple[Any, list[dict[str, Any]]]:
        updates: list[dict[str, Any]] = []
        while True:
            message = await self.read()
            if message.get("id") == request_id and "method" not in message:
                return message, updates
            if message.get("method") == "session/update":
                updates.append(message["params"]["update"])


async def test_a_client_that_stops_reading_gets_coalesced_snapshots_and_bounded_memory(
    tmp_path: Path, project: Path
) -> None:
    allow_all = AskForTools(frozenset())
    async with running_service(tmp_path, policy=allow_all) as harness, trio.open_nursery() as n:
        client = LineClient(socket_pair_for(harness, n))
        new, _ = await client.answer(
            await client.send("session/new", {"cwd": str(project), "mcpServers": []})
        )
        sid = new["result"]["sessionId"]
        # A command far larger than every buffer between it and the client: the socket's, the
        # outbound credit, the run's queue.
        client.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        command = f"seq 1 {SEQ_LINES}; seq 1 {SEQ_LINES}; seq 1 {SEQ_LINES}"
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": shell(command)}]}
            prompt_id = await client.send("session/prompt", prompt)
            await trio.testing.wait_all_tasks_blocked(cushion=0.2)
            growth = tracemalloc.get_traced_memory()[1] - baseline
        finally:
            tracemalloc.stop()
        assert growth < MEMORY_BOUND, growth
        answer, updates = await client.answer(prompt_id)
        assert answer["result"]["stopReason"] == "end_turn"
        rows = [u for u in updates if u["sessionUpdate"] in ("tool_call", "tool_call_update")]
        assert len(rows) <= MAX_SNAPSHOTS
        assert texts(rows[-1]) == [SEQ_OUTPUT[-LIVE_TAIL_CHARS:]]
        n.cancel_scope.cancel()


async def test_background_start_list_stop_and_the_limit(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        pids = [await background_pid(client, sid, f"bg-{n}") for n in range(1, 5)]
        commands = await listing(client, sid)
        assert [c["handle"] for c in commands] == ["bg-1", "bg-2", "bg-3", "bg-4"]
        assert {c["status"] for c in commands} == {"running"}
        assert commands[0]["command"] == "echo $$; exec sleep 60"
        # A fifth fails its own row with one line naming the limit.
        await client.prompt(sid, "/bg sleep 60")
        refused = tool_updates(client, sid)[-1]
        assert refused["status"] == "failed"
        (line,) = texts(refused)
        assert str(MAX_BACKGROUND_COMMANDS) in line
        assert "\n" not in line
        assert len(await listing(client, sid)) == MAX_BACKGROUND_COMMANDS
        # Stop one: its row ends failed with how it ended, the listing says it exited.
        answer = await client.call(
            "_session/background", {"sessionId": sid, "action": "stop", "handle": "bg-2"}
        )
        assert answer == {}
        with trio.fail_after(10):
            await client.wait_until(
                lambda: any(
                    u.get("status") == "failed" and "killed by SIGTERM" in "".join(texts(u))
                    for u in tool_updates(client, sid)
                )
            )
        assert not alive(pids[1])
        stopped = (await listing(client, sid))[1]
        assert stopped == {
            "handle": "bg-2",
            "command": "echo $$; exec sleep 60",
            "status": "exited",
            "exitCode": -15,
        }
        # Room again for one more.
        await client.prompt(sid, "/bg sleep 60")
        assert tool_updates(client, sid)[-1]["status"] == "in_progress"
        with pytest.raises(ProtocolError) as unknown:
            await client.call(
                "_session/background", {"sessionId": sid, "action": "stop", "handle": "bg-99"}
            )
        assert unknown.value.code == -32602
        with pytest.raises(ProtocolError) as nameless:
            await client.call("_session/background", {"sessionId": sid, "action": "stop"})
        assert nameless.value.code == -32602
        await client.close_session(sid)
        assert not any(alive(pid) for pid in pids)


async def test_close_kills_a_background_command_and_load_replays_its_output(
    harness: Harness, project: Path
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        pid = await background_pid(client, sid)
        before = trio.current_time()
        await client.close_session(sid)
        assert trio.current_time() - before < CLOSE_DEADLINE_S
        assert not alive(pid)
        seen = len(client.updates(sid))
        await client.load_session(sid, str(project))
        replayed = [
            u
            for u in client.updates(sid)[seen:]
            if u["sessionUpdate"] in ("tool_call", "tool_call_update")
        ]
        row = next(u for u in replayed if u.get("rawOutput", {}) and "handle" in u["rawOutput"])
        assert row["status"] == "failed"
        assert f"{pid}\n" in "".join(texts(row))


async def test_delete_kills_a_background_command(v2_harness: Harness, project: Path) -> None:
    async with v2_harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        pid = await background_pid(client, sid)
        await client.delete_session(sid)
        assert not alive(pid)


async def test_disconnect_kills_a_background_command(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        pid = await background_pid(client, sid)
    with trio.fail_after(CLOSE_DEADLINE_S):
        while alive(pid):  # noqa: ASYNC110 - no event tells a process outside ours ended
            await trio.sleep(0.01)


async def test_plan_mode_refuses_a_background_command(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.call("session/set_mode", {"sessionId": sid, "modeId": "plan"})
        await client.prompt(sid, "/bg touch ran")
        assert tool_updates(client, sid)[-1]["status"] == "failed"
        assert not (project / "ran").exists()
        assert await listing(client, sid) == []


async def test_a_command_that_ignores_sigterm_is_killed_within_the_close_deadline(
    autojump_clock: trio.testing.MockClock, harness: Harness, project: Path
) -> None:
    # Real time while the real command starts; virtual time for the close and its grace.
    autojump_clock.autojump_threshold = math.inf
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/bg trap '' TERM; echo $$; while :; do sleep 0.05; done")
        with trio.fail_after(10):
            await client.wait_until(
                lambda: any(
                    text.strip().isdigit() for u in tool_updates(client, sid) for text in texts(u)
                )
            )
        (pid,) = {
            int(text)
            for u in tool_updates(client, sid)
            for text in texts(u)
            if text.strip().isdigit()
        }
        autojump_clock.autojump_threshold = 0
        before = trio.current_time()
        await client.close_session(sid)
        assert trio.current_time() - before < CLOSE_DEADLINE_S
        assert not alive(pid)


async def test_a_revoked_lease_kills_its_background_command(
    harness: Harness, project: Path
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        pid = await background_pid(client, sid)
        harness.runtime.sign_out()
        with trio.fail_after(CLOSE_DEADLINE_S):
            while alive(pid):  # noqa: ASYNC110 - no event tells a process outside ours ended
                await trio.sleep(0.01)
