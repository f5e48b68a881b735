"""The Unix socket endpoint rules, over real sockets."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
import trio
import trio.testing

from maple_acp.edge._listener import (
    ConnectionGate,
    EndpointInUse,
    ListenerError,
    serve_endpoint,
)


async def _echo_once(stream: trio.SocketStream) -> None:
    data = await stream.receive_some(1024)
    await stream.send_all(data)


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.fspath(path))
    return sock


async def test_socket_is_owner_only_and_removed_on_stop(tmp_path: Path) -> None:
    path = tmp_path / "run" / "svc.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_endpoint, path, _echo_once, ConnectionGate(8))
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
        await serve_endpoint(path, _echo_once, ConnectionGate(8))
    assert path.is_symlink()
    assert target.read_text() == "x"


async def test_refuses_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "svc.sock"
    path.write_text("not a socket")
    with pytest.raises(ListenerError, match="non-socket"):
        await serve_endpoint(path, _echo_once, ConnectionGate(8))
    assert path.read_text() == "not a socket"


async def test_refuses_when_another_service_answers(tmp_path: Path) -> None:
    path = tmp_path / "svc.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_endpoint, path, _echo_once, ConnectionGate(8))
        with pytest.raises(EndpointInUse):
            await serve_endpoint(path, _echo_once, ConnectionGate(8))
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
        await nursery.start(serve_endpoint, path, _echo_once, ConnectionGate(8))
        sock = await trio.to_thread.run_sync(_connect, path)
        sock.close()
        nursery.cancel_scope.cancel()


async def test_refuses_shared_parent_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ListenerError, match="group or others"):
        await serve_endpoint(shared / "svc.sock", _echo_once, ConnectionGate(8))


async def test_connection_beyond_limit_is_closed_and_others_stay_usable(tmp_path: Path) -> None:
    path = tmp_path / "svc.sock"
    gate = ConnectionGate(2)
    send, events = trio.open_memory_channel[str](16)

    async def until_eof(stream: trio.SocketStream) -> None:
        await send.send("open")
        try:
            async for _ in stream:
                pass
        finally:
            await send.send("closed")

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_endpoint, path, until_eof, gate)
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
