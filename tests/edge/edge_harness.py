"""The in-process harness for edge tests: an AcpService over the demo runtime, reached by
AcpTestClient over memory streams. (A module of its own, not conftest: several test
directories have a conftest, and only a uniquely named module imports reliably.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
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
from maple_acp.testing.store import temp_store


class Harness:
    """A running runtime + ACP service; ``connect()`` opens one more client connection."""

    def __init__(self, runtime: AgentService, acp: AcpService, nursery: trio.Nursery) -> None:
        self.runtime = runtime
        self.acp = acp
        self._nursery = nursery

    @asynccontextmanager
    async def connect(self, **client_options: Any) -> AsyncIterator[AcpTestClient]:
        client_end, service_end = trio.testing.memory_stream_pair()
        done = trio.Event()

        async def serve() -> None:
            try:
                await self.acp.serve_stream(service_end)
            finally:
                done.set()

        self._nursery.start_soon(serve)
        async with open_acp_client(client_end, **client_options) as client:
            yield client
        # The client's exit closed its end: the service sees a disconnect and cleans up.
        await done.wait()


@asynccontextmanager
async def running_service(
    tmp_path: Path,
    *,
    config: AcpServiceConfig | None = None,
    **runtime_options: Any,
) -> AsyncIterator[Harness]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    runtime_options.setdefault("relay_allow_list", ("RELAY_TOKEN",))
    async with temp_store(data) as store:
        # Virtual time holds still while SQLite works in its thread (see VirtualTimeStore).
        runtime = make_demo_service(VirtualTimeStore(store), **runtime_options)
        async with runtime, trio.open_nursery() as nursery:
            runtime.sign_in(DEMO_ACCOUNT)
            acp = AcpService(runtime, config or AcpServiceConfig())
            yield Harness(runtime, acp, nursery)
            nursery.cancel_scope.cancel()
