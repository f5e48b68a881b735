"""A client that stops reading back-pressures the runtime; one oversized update ends a turn."""

from __future__ import annotations

import logging
import socket
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import trio
import trio.testing
from edge_harness import Harness, running_service
from line_client import LineClient as BaseLineClient
from line_client import socket_pair_for

from maple_acp.edge import AcpServiceConfig
from maple_acp.runtime import ToolState, ToolStatus, Turn

#: Updates the backend tries to stream at a client that has stopped reading.
STREAM_UPDATES = 200_000
#: Characters in each of them.
UPDATE_CHARS = 100
#: Host memory may grow by at most this much while the client stalls (outbound admission).
MEMORY_BOUND = 8 * 1024 * 1024


class LineClient(BaseLineClient):
    """The raw client, counting the message text it reads on the way to an answer."""

    async def answer(self, request_id: int) -> tuple[Any, int]:
        """Read until the answer to ``request_id``; also count the message text read on the
        way, in characters (chunks queued together arrive joined, so their number is not the
        load; other updates - the commands after an open, a title - are not either)."""
        chars = 0
        while True:
            message = await self.read()
            if message.get("id") == request_id and "method" not in message:
                return message, chars
            if message.get("method") == "session/update":
                update = message["params"]["update"]
                if update["sessionUpdate"] == "agent_message_chunk":
                    chars += len(update["content"]["text"])


async def _connect(harness: Harness, nursery: trio.Nursery) -> LineClient:
    return LineClient(socket_pair_for(harness, nursery))


async def test_stalled_client_bounds_host_memory_and_loses_nothing(
    harness: Harness, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        client = await _connect(harness, nursery)
        new, _ = await client.answer(
            await client.send("session/new", {"cwd": str(project), "mcpServers": []})
        )
        sid = new["result"]["sessionId"]
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            load = f"/stream {STREAM_UPDATES} {UPDATE_CHARS}"
            prompt_id = await client.send(
                "session/prompt",
                {
                    "sessionId": sid,
                    "prompt": [{"type": "text", "text": load}],
                },
            )
            # The client reads nothing: the writer fills the socket, the outbound credit runs
            # out, the pump stops taking events and the run's queue fills. Then all is still.
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            stalled_growth = tracemalloc.get_traced_memory()[0] - baseline
            assert harness.runtime.status().active_runs == 1
        finally:
            tracemalloc.stop()
        assert stalled_growth < MEMORY_BOUND, stalled_growth
        # Now read: every update arrives, in order, and the turn completes.
        answer, chars = await client.answer(prompt_id)
        assert answer["result"]["stopReason"] == "end_turn"
        assert chars == STREAM_UPDATES * UPDATE_CHARS
        nursery.cancel_scope.cancel()


class OversizeBackend:
    """Sends one tool row whose title alone exceeds a deliberately small outbound budget."""

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text("before")
        await turn.send_tool_row(
            "big", ToolState(name="read", status=ToolStatus.COMPLETED, output_text="y" * 15_000)
        )
        await turn.send_text("after")


async def test_one_oversized_update_ends_the_turn_not_the_connection(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # A small outbound budget: the 15 kB tool row cannot fit in it, everything else can.
    config = AcpServiceConfig(max_outbound_bytes=8 * 1024)
    backend = OversizeBackend()
    async with (
        running_service(tmp_path, backend=backend, config=config) as harness,
        harness.connect() as client,
    ):
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "go")
        assert answer["stopReason"] == "cancelled"
        text = client.text(sid)
        assert text.startswith("before")
        assert "too large" in text
        # The connection is still usable.
        assert (await client.list_sessions())["sessions"]


async def test_a_client_gone_mid_stream_is_a_quiet_end_for_the_host(
    harness: Harness, project: Path, caplog: Any
) -> None:
    """The transport fails while the pump waits for credit: the connection ends without an
    error log or a traceback, the service goes on serving, and the run is gone."""
    caplog.set_level(logging.DEBUG)
    ours, theirs = socket.socketpair()
    service_end = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    client = LineClient(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(harness.acp.serve_stream, service_end)
        new, _ = await client.answer(
            await client.send("session/new", {"cwd": str(project), "mcpServers": []})
        )
        sid = new["result"]["sessionId"]
        await client.send(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": "/stream 20000 4096"}]},
        )
        while (await client.read()).get("method") != "session/update":
            pass
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        # A reset, as a killed client process gives: unread data makes close() send RST.
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.stream.aclose()
    assert harness.runtime.status().active_runs == 0
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert loud == []
    async with harness.connect(initialize=True) as other:
        # Its prompt was admitted: the task stays, free to load.
        listed = (await other.list_sessions())["sessions"]
        assert [s["sessionId"] for s in listed] == [sid]
        await other.load_session(sid, str(project))
