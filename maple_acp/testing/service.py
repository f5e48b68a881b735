"""A running ACP service over the demo runtime, reached by in-memory connections.

The shortest way for a host's tests (and ours) to talk ACP to a real ``AcpService`` with a
real SQLite store::

    async with running_demo_acp(tmp_path) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "/echo hi"))["stopReason"] == "end_turn"

Each ``connect()`` is one more ACP connection over a memory stream pair; leaving it closes the
client's end, which the service sees as a disconnect (and the block waits until the service has
finished that connection's cleanup).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from maple_acp.edge import AcpService, AcpServiceConfig
from maple_acp.runtime import AgentService
from maple_acp.testing.client import AcpTestClient, open_acp_client
from maple_acp.testing.clock import VirtualTimeStore
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.store import STORE_FILE_NAME, temp_store


class AcpHarness:
    """A running runtime + ACP service; :meth:`connect` opens one more client connection."""

    def __init__(
        self, runtime: AgentService, acp: AcpService, nursery: trio.Nursery, store_path: Path
    ) -> None:
        self.runtime = runtime
        self.acp = acp
        #: The SQLite file behind the runtime (for tests that inspect what was persisted).
        self.store_path = store_path
        self._nursery = nursery

    @asynccontextmanager
    async def connect(
        self, *, initialize: bool = False, **client_options: Any
    ) -> AsyncIterator[AcpTestClient]:
        """One ACP connection; ``client_options`` go to :func:`open_acp_client`."""
        client_end, service_end = trio.testing.memory_stream_pair()
        done = trio.Event()

        async def serve() -> None:
            try:
                await self.acp.serve_stream(service_end)
            finally:
                done.set()

        self._nursery.start_soon(serve)
        async with open_acp_client(client_end, **client_options) as client:
            if initialize:
                await client.initialize()
            yield client
        await done.wait()


@asynccontextmanager
async def running_demo_acp(
    directory: str | os.PathLike[str],
    *,
    config: AcpServiceConfig | None = None,
    harness_type: type[AcpHarness] = AcpHarness,
    hold_clock: Callable[[Any], Any] = VirtualTimeStore,
    **runtime_options: Any,
) -> AsyncIterator[AcpHarness]:
    """A signed-in demo runtime over a store in ``directory/data`` and an ``AcpService`` on it.

    ``runtime_options`` go to :func:`~maple_acp.testing.demo.make_demo_service` (a backend,
    ``provisional_grace_s``, ``relay_allow_list``, ...). The store is wrapped in ``hold_clock``
    (:class:`~maple_acp.testing.clock.VirtualTimeStore`, or ``ClockHoldingStore`` for tests
    that queue many store calls), so deadline tests may use a mock clock with a zero autojump
    threshold. ``harness_type`` lets a test suite add its own helpers."""
    data = Path(directory) / "data"
    data.mkdir(exist_ok=True)
    async with temp_store(data) as store:
        runtime = make_demo_service(hold_clock(store), **runtime_options)
        async with runtime, trio.open_nursery() as nursery:
            runtime.sign_in(DEMO_ACCOUNT)
            acp = AcpService(runtime, config or AcpServiceConfig())
            yield harness_type(runtime, acp, nursery, data / STORE_FILE_NAME)
            nursery.cancel_scope.cancel()
