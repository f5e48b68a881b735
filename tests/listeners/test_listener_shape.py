"""Both listeners in one shape, run by one service: each started in a nursery with where it
serves reported, both counting in one connection limit, both ended by ``AcpService.stop``
within its deadline; and the accept rule they share, on a mock clock."""

from __future__ import annotations

import errno
import inspect
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx2
import orjson
import pytest
import trio
import trio.testing

from maple_acp import AcpService, AcpServiceConfig, NetworkListener, NetworkSettings, UnixListener
from maple_acp.edge import STOP_DEADLINE_S
from maple_acp.listeners import ACCEPT_RETRY_S, AcceptRetry, Listener
from maple_acp.net import read_or_create_token
from maple_acp.runtime import AgentService
from maple_acp.testing.client import open_acp_client

INITIALIZE = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}},
    }
)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory with a path short enough for a socket (tmp_path may not be)."""
    directory = Path(tempfile.mkdtemp(prefix="macp-l-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_both_listeners_have_the_one_shape() -> None:
    shape = inspect.signature(Listener.serve)
    for listener in (UnixListener, NetworkListener):
        assert inspect.signature(listener.serve) == shape, listener


async def test_a_service_serves_both_listeners_in_one_limit_and_stop_ends_both(
    service: AgentService, short_dir: Path
) -> None:
    path = short_dir / "run" / "acp.sock"
    data = short_dir / "data"
    data.mkdir(mode=0o700)
    token = read_or_create_token(data)
    acp = AcpService(service, AcpServiceConfig(max_connections=2))
    settings = NetworkSettings(host="127.0.0.1", port=0, data_dir=data)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with trio.open_nursery() as nursery:
        socket_address = await acp.listen(nursery, UnixListener(path))
        url = await acp.listen(nursery, NetworkListener(settings))
        assert socket_address == os.fspath(path)
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/acp")
        assert acp.status().listening == (socket_address, url)
        assert acp.status().endpoint == socket_address
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        stream = await trio.open_unix_socket(os.fspath(path))
        async with (
            open_acp_client(stream) as client,
            httpx2.AsyncClient(trust_env=False, timeout=10.0) as http,
        ):
            await client.initialize()
            opened = await http.post(url, content=INITIALIZE, headers=headers)
            assert opened.status_code == 200, opened.text
            assert acp.status().connections == 2
            # One limit for both: a third connection on either is refused.
            refused = await http.post(url, content=INITIALIZE, headers=headers)
            assert refused.status_code == 503, refused.text
            third = await trio.open_unix_socket(os.fspath(path))
            assert await third.receive_some(10) == b""
            await third.aclose()
            with trio.fail_after(STOP_DEADLINE_S):
                await acp.stop(persist=False)
        status = acp.status()
        assert (status.running, status.listening, status.connections) == (False, (), 0)
        assert not path.exists()
        with pytest.raises(OSError, match="all attempts to connect"):
            await trio.open_tcp_stream("127.0.0.1", port)
        # Stopped, not spent: the service starts again on the same endpoint.
        assert await acp.listen(nursery, UnixListener(path)) == socket_address
        await acp.stop(persist=False)
        nursery.cancel_scope.cancel()


async def test_a_refused_network_setting_raises_from_listen_and_nothing_listens(
    service: AgentService, short_dir: Path
) -> None:
    from maple_acp.net import HttpSetupError

    acp = AcpService(service)
    settings = NetworkSettings(host="0.0.0.0", port=0, data_dir=short_dir)
    async with trio.open_nursery() as nursery:
        with pytest.raises(HttpSetupError, match="not a loopback address"):
            await acp.listen(nursery, NetworkListener(settings))
        assert not acp.status().running


class FailingListener:
    """A listening socket whose ``accept`` fails with ``code`` ``times`` times, then
    answers ``"accepted"``."""

    def __init__(self, code: int, times: int) -> None:
        self.code = code
        self.left = times

    async def accept(self) -> str:
        await trio.lowlevel.checkpoint()
        if self.left:
            self.left -= 1
            raise OSError(self.code, os.strerror(self.code))
        return "accepted"


async def test_accept_retries_a_missing_resource_and_tells_it_once_a_minute(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    retry = AcceptRetry("the test socket")
    tries = int(150 / ACCEPT_RETRY_S)  # 150 s of failing, a try every 0.1 s
    accepted = await retry.accept(FailingListener(errno.EMFILE, tries))  # type: ignore[arg-type]
    assert accepted == "accepted"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert all(line.startswith("accept failed on the test socket (EMFILE: ") for line in lines)
    counts = [int(line.split(") ", 1)[1].split(" ", 1)[0]) for line in lines]
    assert counts[0] == 1
    assert all(590 <= count <= 610 for count in counts[1:]), counts


async def test_accept_lets_any_other_failure_propagate(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(OSError, match="Bad file descriptor") as raised:
        await AcceptRetry("the test socket").accept(FailingListener(errno.EBADF, 1))  # type: ignore[arg-type]
    assert raised.value.errno == errno.EBADF
    assert not caplog.records
