"""A connection that ends holding the most sessions it may: its release does not stall other
connections, and every lease is gone within the cleanup bound."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trio.testing

from maple_acp.edge import DISCONNECT_CLEANUP_S, AcpService, AcpServiceConfig
from maple_acp.edge._sessions import MAX_SESSIONS_PER_CONNECTION
from maple_acp.runtime import DEFAULT_PROVISIONAL_GRACE_S
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.clock import ClockHoldingStore
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.service import AcpHarness
from maple_acp.testing.store import temp_store

#: Half the sessions get a prompt (durable tasks), the rest stay provisional.
PROMPTED = MAX_SESSIONS_PER_CONNECTION // 2
#: Scheduler passes one request of another connection may take while the release runs. A
#: pass is the unit the release shares the Trio thread in (each store call costs at least
#: one), so the bound does not depend on the machine's speed. Released all at once, the
#: leases' store calls queue ahead of the request: it takes one pass per lease and more.
MAX_PASSES_PER_REQUEST = MAX_SESSIONS_PER_CONNECTION // 2


#: Sessions set up at once.
OPEN_BATCH = 8


class SchedulerPasses(trio.abc.Instrument):
    """Counts the scheduler's passes (one per wait for I/O or a worker thread)."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


async def _open_full(client: AcpTestClient, project: Path) -> list[str]:
    """The most sessions a connection may hold; ``PROMPTED`` of them prompted."""
    sids: list[str] = []

    async def open_one(prompt: bool) -> None:
        sid = (await client.new_session(str(project)))["sessionId"]
        sids.append(sid)
        if prompt:
            assert (await client.prompt(sid, "/echo kept"))["stopReason"] == "end_turn"

    # A few at a time: each call to the virtual-time store spins the scheduler while it waits.
    for first in range(0, MAX_SESSIONS_PER_CONNECTION, OPEN_BATCH):
        async with trio.open_nursery() as nursery:
            for index in range(first, first + OPEN_BATCH):
                nursery.start_soon(open_one, index < PROMPTED)
    return sids


@asynccontextmanager
async def _holder(
    harness: AcpHarness, project: Path
) -> AsyncIterator[tuple[list[str], trio.Event, trio.Event]]:
    """A connection holding a full set of sessions in the background: set the first event to
    make it disconnect; the second is set once the service finished its cleanup."""
    sids: list[str] = []
    leave, gone = trio.Event(), trio.Event()

    async def hold(task_status: trio.TaskStatus[None]) -> None:
        async with harness.connect(initialize=True) as client:
            sids.extend(await _open_full(client, project))
            task_status.started()
            await leave.wait()
        gone.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(hold)
        yield sids, leave, gone


@asynccontextmanager
async def _real_time_service(directory: Path) -> AsyncIterator[AcpHarness]:
    """The demo service over a plain store: the harness's virtual-time store spins the
    scheduler during store calls, which would make every call look like many passes."""
    async with temp_store(directory) as store:
        runtime = make_demo_service(store)
        async with runtime, trio.open_nursery() as nursery:
            runtime.sign_in(DEMO_ACCOUNT)
            yield AcpHarness(runtime, AcpService(runtime, AcpServiceConfig()), nursery, directory)
            nursery.cancel_scope.cancel()


async def test_other_connections_keep_answering_while_a_full_connection_is_released(
    tmp_path: Path, project: Path
) -> None:
    async with (
        _real_time_service(tmp_path) as harness,
        harness.connect(initialize=True) as other,
        _holder(harness, project) as (sids, leave, gone),
    ):

        def held() -> int:
            return sum(harness.runtime.lease_of(sid) is not None for sid in sids)

        assert held() == MAX_SESSIONS_PER_CONNECTION
        warm = (await other.new_session(str(project)))["sessionId"]
        await other.close_session(warm)

        passes = SchedulerPasses()
        trio.lowlevel.add_instrument(passes)
        try:
            leave.set()
            # From the first release on (the revocation before it releases nothing).
            while held() == MAX_SESSIONS_PER_CONNECTION:
                await trio.lowlevel.checkpoint()
            answered_during_release = 0
            worst = 0

            def answered(since: int) -> None:
                nonlocal answered_during_release, worst
                worst = max(worst, passes.count - since)
                answered_during_release += held() > 0

            while held():
                since = passes.count
                sid = (await other.new_session(str(project)))["sessionId"]
                answered(since)
                since = passes.count
                await other.list_sessions(cwd=str(project))
                answered(since)
                await other.close_session(sid)
        finally:
            trio.lowlevel.remove_instrument(passes)
        await gone.wait()
        # The other connection was served while the release ran, never behind all of it.
        assert answered_during_release >= 2
        assert worst <= MAX_PASSES_PER_REQUEST, worst


@asynccontextmanager
async def _clock_holding_service(directory: Path) -> AsyncIterator[AcpHarness]:
    """The demo service over a store that holds the mock clock during its calls without a
    busy task: 256 sessions' store calls, each with a busy task fighting the store's thread for
    the interpreter lock, made this test take from seconds to many minutes."""
    async with temp_store(directory) as store:
        runtime = make_demo_service(ClockHoldingStore(store))
        async with runtime, trio.open_nursery() as nursery:
            runtime.sign_in(DEMO_ACCOUNT)
            yield AcpHarness(runtime, AcpService(runtime, AcpServiceConfig()), nursery, directory)
            nursery.cancel_scope.cancel()


async def test_every_lease_of_a_full_connection_is_released_within_the_bound(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, project: Path
) -> None:
    async with _clock_holding_service(tmp_path) as harness:
        async with _holder(harness, project) as (sids, leave, gone):
            opened_at = harness.runtime.now_ms()
            leave.set()
            left_at = trio.current_time()
            await gone.wait()
            assert trio.current_time() - left_at <= DISCONNECT_CLEANUP_S
        assert all(harness.runtime.lease_of(sid) is None for sid in sids)
        assert harness.runtime.status().leases == 0
        grace_ms = int(DEFAULT_PROVISIONAL_GRACE_S * 1000)
        durable = provisional = 0
        for sid in sids:
            task = await harness.runtime.store.get_task(sid)
            assert task is not None
            if task.provisional:
                # A disconnect keeps a never-prompted task for its grace period.
                assert task.provisional_expires_ms is not None
                assert task.provisional_expires_ms >= opened_at + grace_ms
                provisional += 1
            else:
                assert task.provisional_expires_ms is None
                durable += 1
        assert (durable, provisional) == (PROMPTED, MAX_SESSIONS_PER_CONNECTION - PROMPTED)
