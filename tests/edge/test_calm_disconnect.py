"""A client that quits during a turn is a calm event: over a real Unix socket, a client
disconnects while the service streams a reply to it (the write then fails) or while a turn
waits; nothing at INFO or above names the transport's exception or carries a traceback, and
the connection's closing line says the other side went away."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import orjson
import pytest
import trio
from edge_harness import running_service

from maple_acp.edge import AcpServiceConfig

#: Bounds a hang; every step here takes milliseconds.
DEADLINE = 20.0
#: Words an INFO+ line about a client going away must not carry.
ALARMING = ("BrokenResourceError", "ClosedResourceError", "Traceback", "Broken pipe", "Errno")


def _line(method: str, params: object, msg_id: int) -> bytes:
    return (
        orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}) + b"\n"
    )


async def _read_answer(stream: trio.SocketStream, msg_id: int, buffer: bytearray) -> object:
    while True:
        while b"\n" in buffer:
            raw, _, rest = bytes(buffer).partition(b"\n")
            buffer[:] = rest
            message = orjson.loads(raw)
            if message.get("id") == msg_id:
                return message["result"]
        data = await stream.receive_some(65536)
        assert data, "the service closed the connection"
        buffer.extend(data)


@pytest.mark.parametrize(
    ("prompt", "wait_for_output"),
    [("/stream 4000 4000", True), ("/hang", False)],
    ids=["while-writing", "while-waiting"],
)
async def test_a_client_quitting_during_a_turn_leaves_no_error_looking_line(
    tmp_path: Path,
    project: Path,
    caplog: pytest.LogCaptureFixture,
    prompt: str,
    wait_for_output: bool,
) -> None:
    caplog.set_level(logging.DEBUG)
    client_sock, service_sock = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = trio.SocketStream(client_sock)
    async with (
        running_service(tmp_path, config=AcpServiceConfig()) as harness,
        trio.open_nursery() as nursery,
    ):
        # The service's end of a real Unix socket, served as the listener serves each one;
        # the nursery ends once the connection's cleanup has.
        nursery.start_soon(harness.acp.serve_stream, trio.SocketStream(service_sock))
        buffer = bytearray()
        with trio.fail_after(DEADLINE):
            await stream.send_all(_line("initialize", {"protocolVersion": 1}, 0))
            await _read_answer(stream, 0, buffer)
            await stream.send_all(_line("session/new", {"cwd": str(project), "mcpServers": []}, 1))
            session = await _read_answer(stream, 1, buffer)
            assert isinstance(session, dict)
            params = {
                "sessionId": session["sessionId"],
                "prompt": [{"type": "text", "text": prompt}],
            }
            await stream.send_all(_line("session/prompt", params, 2))
            if wait_for_output:
                # The service is writing the reply: the client reads a little and quits,
                # leaving unread bytes behind (the service's next read is a reset).
                await stream.receive_some(65536)
            else:
                await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    for record in loud:
        text = record.getMessage()
        assert record.exc_info is None, text
        assert not any(word in text for word in ALARMING), text
    closed = [r.getMessage() for r in loud if r.getMessage().startswith("ACP connection closed")]
    assert closed == ["ACP connection closed: the other side went away"]
