"""The Unix socket listener: the endpoint rules and the connection slots, over real sockets."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from maple_acp.listeners import EndpointInUse, ListenerError, UnixListener


class StreamHost:
    """A host that serves each stream with ``handler``, in ``maximum`` slots."""

    def __init__(
        self, handler: Callable[[trio.abc.Stream], Awaitable[None]], maximum: int = 8
    ) -> None:
        self.handler = handler
        self.maximum = maximum
        self.active = 0

    def try_admit(self) -> bool:
        if self.active >= self.maximum:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        await self.handler(stream)

    async def session_exists(self, session_id: str) -> bool:
        return False


async def _echo_once(stream: trio.abc.Stream) -> None:
    data = await stream.receive_some(1024)
    await stream.send_all(data)


ECHO = StreamHost(_echo_once)


async def serve_endpoint(
    path: Path,
    host: StreamHost = ECHO,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    await UnixListener(path).serve(host, task_status=task_status)


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.fspath(path))
    return sock


async def test_socket_is_owner_only_and_removed_on_stop(tmp_path: Path) -> None:
    path = tmp_path / "run" / "svc.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_endpoint, path)
        info = os.lstat(path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(path.parent).st_mode) == 0o700
        client = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await client.connect(os.fspath(path))
        await client.send(b"ping")
        assert await client.recv(16) == b"ping"
        client.close()
        nursery.cancel_scope.cancel()
    assert not path.exists()
    assert [p.name for p in path.parent.iterdir()] == []


async def test_refuses_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("x")
    path = tmp_path / "svc.sock"
    path.symlink_to(target)
    with pytest.raises(ListenerError, match="symlink"):
        await serve_endpoint(path)
    assert path.is_symlink()
    assert target.read_text() == "x"


async def test_refuses_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "svc.sock"
    path.write_text("not a socket")
    with pytest.raises(ListenerError, match="non-socket"):
        await serve_endpoint(path)
    assert path.read_text() == "not a socket"


async def test_refuses_when_another_service_answers(tmp_path: Path) -> None:
    path = tmp_path / "svc.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_endpoint, path)
        with pytest.raises(EndpointInUse):
            await serve_endpoint(path)
        # The first service is untouched and still answers.
        sock = await trio.to_thread.run_sync(_connect, path)
        sock.close()
        nursery.cancel_scope.cancel()


async def test_removes_stale_socket(tmp_path: Path) -> None:
    path = tmp_path / "svc.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.fspath(path))
    stale.close()  # bound but never listening: connections are refused
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_endpoint, path)
        sock = await trio.to_thread.run_sync(_connect, path)
        sock.close()
        nursery.cancel_scope.cancel()


async def test_refuses_shared_parent_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ListenerError, match="group or others"):
        await serve_endpoint(shared / "svc.sock")


async def test_connection_beyond_limit_is_closed_and_others_stay_usable(tmp_path: Path) -> None:
    path = tmp_path / "svc.sock"
    send, events = trio.open_memory_channel[str](16)

    async def until_eof(stream: trio.abc.Stream) -> None:
        await send.send("open")
        try:
            async for _ in stream:
                pass
        finally:
            await send.send("closed")

    async with trio.open_nursery() as nursery:
        gate = StreamHost(until_eof, maximum=2)
        await nursery.start(serve_endpoint, path, gate)
        first = await trio.open_unix_socket(os.fspath(path))
        second = await trio.open_unix_socket(os.fspath(path))
        assert [await events.receive(), await events.receive()] == ["open", "open"]
        third = await trio.open_unix_socket(os.fspath(path))
        # The refused connection sees EOF at once, and never reaches the handler.
        assert await third.receive_some(10) == b""
        assert gate.active == 2
        await first.aclose()
        assert await events.receive() == "closed"
        # The gate is released after the handler returns; let that finish.
        await trio.testing.wait_all_tasks_blocked()
        fourth = await trio.open_unix_socket(os.fspath(path))
        assert await events.receive() == "open"
        await fourth.send_all(b"still usable")
        await second.send_all(b"still usable")
        for stream in (second, third, fourth):
            await stream.aclose()
        assert [await events.receive(), await events.receive()] == ["closed", "closed"]
        await trio.testing.wait_all_tasks_blocked()
        assert gate.active == 0
        nursery.cancel_scope.cancel()
