"""A stalled reader over HTTP/2: a client that never grows a session stream's window (its
connection window stays wide open) holds no more than that window in the server and the
connection's credit window in the host, and the host goes on serving other connections. Then
the client reads again and gets every event, once and in order.

The listener here is :func:`serve_network` in the test, in front of the demo host's ACP service,
so the test can see the connection's channel: how far the session stream counts as written
(what gave its credit back) and what it holds."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio.testing
from h2c_client import H2cClient
from net_support import DEADLINE, INITIALIZE, NetHost, SseReader, net_host, rpc, sse_events

from maple_acp.net import HttpSetupError, NetworkSettings, serve_network
from maple_acp.net._channel import NetworkChannel
from maple_acp.rpc import MAX_OUTBOUND_BYTES, MAX_OUTBOUND_LINES

#: The load: more lines than the credit window's 256, each well over a kilobyte.
CHUNKS, SIZE = 400, 2000
#: The client's stream window (the HTTP/2 default it never grows).
WINDOW = 65535


class Recorder:
    """The host's ACP service, noting each channel it is asked to serve."""

    def __init__(self, acp: Any) -> None:
        self._acp = acp
        self.channels: list[NetworkChannel] = []

    def try_admit(self) -> bool:
        return bool(self._acp.try_admit())

    def release(self) -> None:
        self._acp.release()

    async def session_exists(self, session_id: str) -> bool:
        return bool(await self._acp.session_exists(session_id))

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        assert isinstance(stream, NetworkChannel)
        self.channels.append(stream)
        await self._acp.serve_stream(stream)


def events_of(body: bytes) -> list[tuple[int | None, Any]]:
    return sse_events(bytearray(body))


async def still_serves(host: NetHost, url: str) -> None:
    """A new HTTP/1.1 connection gets initialize and session/list answered."""
    async with httpx2.AsyncClient(trust_env=False, timeout=DEADLINE) as client:
        json = {"Content-Type": "application/json"}
        opened = await client.post(url, content=INITIALIZE, headers=host.headers(**json))
        assert opened.status_code == 200
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        sse = host.headers(**connection, Accept="text/event-stream")
        async with client.stream("GET", url, headers=sse) as stream:
            posted = await client.post(
                url, content=rpc("session/list", {}, 1), headers=host.headers(**json, **connection)
            )
            assert posted.status_code == 202
            _, answer = await SseReader(stream).until(lambda m: m.get("id") == 1)
        assert "sessions" in answer["result"]
        await client.delete(url, headers=host.headers(**connection))


async def test_a_stalled_http2_reader_holds_its_window_and_the_credit_window_only(
    project: Path,
) -> None:
    async with net_host() as host, trio.open_nursery() as nursery:
        recorder = Recorder(host.lifecycle.acp)
        settings = NetworkSettings(host="127.0.0.1", port=0, data_dir=host.data_dir)
        url = await nursery.start(serve_network, recorder, settings)
        address, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        client = await H2cClient.connect(address, int(port))
        nursery.start_soon(client.run)
        with trio.fail_after(DEADLINE):
            json = {"content-type": "application/json"}
            status, headers, _ = await client.answer(
                await client.request("POST", host.headers(**json), INITIALIZE)
            )
            assert status == 200
            connection = {"acp-connection-id": headers[b"acp-connection-id"].decode()}
            main = await client.request(
                "GET", host.headers(**connection, accept="text/event-stream")
            )
            new = rpc("session/new", {"cwd": str(project), "mcpServers": []}, 1)
            assert (
                await client.answer(
                    await client.request("POST", host.headers(**json, **connection), new)
                )
            )[0] == 202
            await client.until(
                lambda: any(m.get("id") == 1 for _, m in events_of(client.body[main]))
            )
            session_id = next(m for _, m in events_of(client.body[main]) if m.get("id") == 1)[
                "result"
            ]["sessionId"]
            named = {**connection, "acp-session-id": session_id}
            stalled = await client.request(
                "GET", host.headers(**named, accept="text/event-stream"), stall=True
            )
            await client.until(lambda: stalled in client.headers)
            prompt = rpc(
                "session/prompt",
                {
                    "sessionId": session_id,
                    "prompt": [{"type": "text", "text": f"/stream {CHUNKS} {SIZE}"}],
                },
                2,
            )
            assert (
                await client.answer(
                    await client.request("POST", host.headers(**json, **named), prompt)
                )
            )[0] == 202
            # The server sends what the window allows, then nothing more...
            await client.until(lambda: len(client.body[stalled]) >= WINDOW - 16 * 1024)
            # ...and once everything has settled, the host has let go of no more than that.
            await trio.testing.wait_all_tasks_blocked(cushion=0.2)
            assert len(client.body[stalled]) <= WINDOW
            received = events_of(client.body[stalled])
            last_received = received[-1][0] if received else 0
            assert last_received is not None
            channel = recorder.channels[0]
            stream = channel.sessions[session_id]
            # Written (credit given back) means taken by the client's window: at most the
            # event the window cut in two beyond what the client holds whole.
            assert stream.written_id <= last_received + 1, (stream.written_id, last_received)
            held = list(stream.pending)
            assert len(held) <= MAX_OUTBOUND_LINES
            assert sum(len(line) for _, line in held) <= MAX_OUTBOUND_BYTES
            # The turn is held back by the window, not finished into a buffer.
            assert not any(m.get("id") == 2 for _, m in received)

            await still_serves(host, url)

            # The client reads again: every chunk arrives, once and in order, then the answer.
            await client.unstall(stalled)
            await client.until(
                lambda: any(m.get("id") == 2 for _, m in events_of(client.body[stalled]))
            )
            everything = events_of(client.body[stalled])
            ids = [event_id for event_id, _ in everything]
            assert ids == list(range(1, len(ids) + 1))
            text = "".join(
                m["params"]["update"]["content"]["text"]
                for _, m in everything
                if m.get("method") == "session/update"
                and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
            )
            assert text == "x" * (CHUNKS * SIZE)
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_push_returns_only_once_the_window_took_every_byte() -> None:
    # What the listener relies on in hypercorn: its sending task pops at most the window, and
    # a pop of nothing (a zero window) must not let the writer go.
    from hypercorn.trio.worker_context import EventWrapper

    from maple_acp.net._h2_flow import WindowBoundBuffer

    buffer = WindowBoundBuffer(EventWrapper)
    returned = trio.Event()

    async def push() -> None:
        await buffer.push(b"x" * 100)
        returned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(push)
        await trio.testing.wait_all_tasks_blocked()
        for window in (0, 60, 0):
            assert await buffer.pop(window) == b"x" * window
            await trio.testing.wait_all_tasks_blocked()
            assert not returned.is_set()
        assert await buffer.pop(60) == b"x" * 40
        await trio.testing.wait_all_tasks_blocked()
        assert returned.is_set()
        # A stream that ends (reset, connection gone) lets a waiting writer go too.
        returned = trio.Event()
        nursery.start_soon(push)
        await trio.testing.wait_all_tasks_blocked()
        assert not returned.is_set()
        await buffer.close()
        await trio.testing.wait_all_tasks_blocked()
        assert returned.is_set()


def test_the_listener_puts_the_window_bound_buffer_in_hypercorns_place(tmp_path: Path) -> None:
    from hypercorn.protocol import h2 as hypercorn_h2

    from maple_acp.net._h2_flow import WindowBoundBuffer
    from maple_acp.net._server import _hypercorn_config

    _hypercorn_config(NetworkSettings(host="127.0.0.1", port=0, data_dir=tmp_path))
    assert hypercorn_h2.StreamBuffer is WindowBoundBuffer
    # Hypercorn makes each stream's buffer by that module-level name.
    assert "StreamBuffer(self.context.event_class)" in inspect.getsource(
        hypercorn_h2.H2Protocol._create_stream
    )


def test_a_hypercorn_whose_buffer_is_unknown_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from hypercorn.protocol import h2 as hypercorn_h2

    from maple_acp.net import _h2_flow

    class Unknown:
        pass

    monkeypatch.setattr(hypercorn_h2, "StreamBuffer", Unknown)
    with pytest.raises(HttpSetupError, match="HTTP/2 send buffer"):
        _h2_flow.install()
    assert hypercorn_h2.StreamBuffer is Unknown
