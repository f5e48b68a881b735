"""One malformed line never wedges a connection: the reader answers it at once even while held
permission asks have spent the whole outbound credit, and the end of a connection revokes and
releases every lease within the cleanup bound whatever its outbound queue holds.

The first two tests queue dozens of store calls at once, so their store holds the mock clock
with ``ClockHoldingStore`` and they settle on ``ClockHoldingStore.settled``. Under the default
``VirtualTimeStore`` every queued call keeps a busy task runnable: virtual time stands still
and ``wait_all_tasks_blocked`` cannot return until the last queued call is done, while every
pass steps every busy task and the store's thread waits for the interpreter lock between its
SQLite calls. That cost grows faster than the queue and stalled full runs on a loaded
machine."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service
from test_backpressure import LineClient

from maple_acp.edge import AcpServiceConfig
from maple_acp.edge._connection import DISCONNECT_CLEANUP_S
from maple_acp.testing.client import AcpTestClient, open_acp_client
from maple_acp.testing.clock import ClockHoldingStore

#: Sessions of the review's repro, each with one permission ask held open.
SESSIONS = 64
#: Characters of each ask's shell command: the raw input stays under the 64 KiB raw bound, so
#: every ask carries all of it and 64 asks need more than the whole outbound credit.
COMMAND_CHARS = 65_400
#: A lowered outbound budget (bytes) that a few of those asks spend, where the whole repro
#: need not be replayed; and the sessions that then outnumber what it holds.
SMALL_BUDGET = 256 * 1024
FEW_SESSIONS = 8
#: Kernel socket buffer of the service's end, so that a client that stops reading stalls the
#: writer after a few frames.
SOCKET_BUFFER = 32 * 1024
#: Virtual seconds a whole test may take: only a hang reaches it.
HANG_GUARD_S = 120
#: The review's malformed line: a request cut short.
CUT_SHORT = b'{"jsonrpc": "2.0", "id": 99, "method":'


def big_ask(marker: int) -> str:
    """A prompt whose one tool call asks permission with a large input. Its first line is
    short: the task's title comes from it."""
    command = f"true {marker} " + "x" * COMMAND_CHARS
    return "go\n/tool shell " + orjson.dumps({"command": command}).decode()


def socket_streams(buffer: int | None = None) -> tuple[trio.SocketStream, trio.SocketStream]:
    ours, theirs = socket.socketpair()
    if buffer is not None:
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return (
        trio.SocketStream(trio.socket.from_stdlib_socket(ours)),
        trio.SocketStream(trio.socket.from_stdlib_socket(theirs)),
    )


async def settle(count: Any, store: ClockHoldingStore) -> int:
    """Wait until ``count()`` stops growing while everything is blocked and no store call is
    in flight; return it."""
    seen = -1
    while count() != seen:
        seen = count()
        await store.settled()
    return int(seen)


@asynccontextmanager
async def served_over_a_socket(
    harness: Harness, nursery: trio.Nursery, **client_options: Any
) -> AsyncIterator[AcpTestClient]:
    client_end, service_end = socket_streams()
    nursery.start_soon(harness.acp.serve_stream, service_end)
    async with open_acp_client(client_end, **client_options) as client:
        yield client


async def test_a_malformed_line_behind_held_asks_is_answered_and_every_prompt_completes(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, project: Path
) -> None:
    answer_now = trio.Event()

    async def reject_later(params: Any) -> str:
        await answer_now.wait()
        return "reject"

    answers: list[Any] = []
    async with (
        running_service(tmp_path, hold_clock=ClockHoldingStore) as harness,
        trio.open_nursery() as service,
        served_over_a_socket(harness, service, permission=reject_later) as client,
    ):
        store = harness.runtime.store
        assert isinstance(store, ClockHoldingStore)
        sids = [(await client.new_session(str(project)))["sessionId"] for _ in range(SESSIONS)]
        with trio.fail_after(HANG_GUARD_S):
            await _prompt_all(client, sids, answers, answer_now, store)
        assert len(client.permission_requests) == SESSIONS
        assert [a["stopReason"] for a in answers] == ["end_turn"] * SESSIONS
        service.cancel_scope.cancel()


async def _prompt_all(
    client: AcpTestClient,
    sids: list[str],
    answers: list[Any],
    answer_now: trio.Event,
    store: ClockHoldingStore,
) -> None:
    """Prompt every session at once; once the asks have spent the credit, send the malformed
    line, see it answered, then let the asks be answered and every prompt end."""

    async def prompt(index: int) -> None:
        answers.append(await client.prompt(sids[index], big_ask(index)))

    async with trio.open_nursery() as prompts:
        for index in range(SESSIONS):
            prompts.start_soon(prompt, index)
        asked = await settle(lambda: len(client.permission_requests), store)
        # The held asks spent the credit: the last ask is still waiting for room.
        assert asked < SESSIONS
        await client.send_raw(CUT_SHORT)
        with trio.fail_after(DISCONNECT_CLEANUP_S):
            await client.wait_until(
                lambda: any(
                    isinstance(m, dict) and m.get("error", {}).get("code") == -32700
                    for m in client.inbound()
                )
            )
        # The reader still reads: the answers free the credit and every prompt ends.
        answer_now.set()


@pytest.mark.parametrize("gone", ["stops-reading-and-half-closes", "reads-asks-then-closes"])
async def test_a_client_gone_behind_a_full_outbound_queue_loses_every_lease_in_time(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, project: Path, gone: str
) -> None:
    """The client stops answering (and, in the first case, reading: the writer stalls on a
    full socket), sends the malformed line and goes away: within the cleanup bound no lease
    and no run is left, and another connection loads every task."""
    config = AcpServiceConfig(max_outbound_bytes=SMALL_BUDGET)
    async with running_service(
        tmp_path, config=config, provisional_grace_s=600, hold_clock=ClockHoldingStore
    ) as harness:
        store = harness.runtime.store
        assert isinstance(store, ClockHoldingStore)
        client_end, service_end = socket_streams(SOCKET_BUFFER)
        client = LineClient(client_end)
        ended = trio.Event()

        async def serve() -> None:
            await harness.acp.serve_stream(service_end)
            ended.set()

        async with trio.open_nursery() as service:
            service.start_soon(serve)
            sids = []
            for _ in range(FEW_SESSIONS):
                new, _ = await client.answer(
                    await client.send("session/new", {"cwd": str(project), "mcpServers": []})
                )
                sids.append(new["result"]["sessionId"])
            for index, sid in enumerate(sids):
                prompt = [{"type": "text", "text": big_ask(index)}]
                await client.send("session/prompt", {"sessionId": sid, "prompt": prompt})
            if gone == "reads-asks-then-closes":
                # Everything the service could send: the asks that fit in the credit. Once
                # all is still, the virtual clock ends the wait.
                asks = 0
                with trio.move_on_after(1):
                    while True:
                        message = await client.read()
                        asks += message.get("method") == "session/request_permission"
                assert 0 < asks < FEW_SESSIONS
            await store.settled()
            assert harness.runtime.status().active_runs == FEW_SESSIONS
            await client.stream.send_all(CUT_SHORT + b"\n")
            if gone == "reads-asks-then-closes":
                await client.stream.aclose()
            else:
                # Gone without closing the socket: nothing it will ever read again.
                await client.stream.send_eof()
            # The connection ends once every lease of it is released (or its bound passed).
            with trio.fail_after(DISCONNECT_CLEANUP_S):
                await ended.wait()
            status = harness.runtime.status()
            assert (status.leases, status.active_runs) == (0, 0)
            await client.stream.aclose()
        async with harness.connect() as other:
            for sid in sids:
                await other.load_session(sid, str(project))
            assert harness.runtime.status().leases == FEW_SESSIONS


async def test_a_normal_disconnect_logs_the_session_closed_not_revoked(
    harness: Harness, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.edge")
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "hello")
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert f"session {sid} closed: connection ended" in infos
    assert not [line for line in infos if "revoked" in line]


async def test_a_revocation_by_the_runtime_is_still_logged_as_one(
    harness: Harness, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.edge")
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        harness.runtime.sign_out()
        await trio.testing.wait_all_tasks_blocked()
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert f"session {sid} was revoked by the runtime" in infos
        assert f"session {sid} closed: connection ended" not in infos
