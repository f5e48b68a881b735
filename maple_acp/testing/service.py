"""A running ACP service over a real runtime and store, reached by in-memory connections: the
demo backend, or the host's own.

The shortest way for a host's tests (and ours) to talk ACP to a real ``AcpService`` with a
real SQLite store::

    async with running_acp(tmp_path, backend=MyEngine()) as harness:
        async with harness.connect(initialize=True, schema=load_acp_schema()) as client:
            sid = (await client.new_session(str(project)))["sessionId"]
            assert (await client.prompt(sid, "hi"))["stopReason"] == "end_turn"

``running_demo_acp(tmp_path)`` is the same over the demo backend, its catalog and policy.
Each ``connect()`` is one more ACP connection over a memory stream pair; leaving it closes the
client's end, which the service sees as a disconnect (and the block waits until the service has
finished that connection's cleanup). A state machine, whose steps cannot hold a ``with`` block
open, uses :meth:`AcpHarness.open_connection` and :meth:`HarnessConnection.disconnect`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.edge import AcpService, AcpServiceConfig
from maple_acp.runtime import AgentBackend, AgentService, ModelCatalog, PermissionPolicy
from maple_acp.testing.client import AcpTestClient, open_acp_client
from maple_acp.testing.clock import VirtualTimeStore, ignore_present_children
from maple_acp.testing.demo import DEMO_ACCOUNT
from maple_acp.testing.store import STORE_FILE_NAME, temp_store


class HarnessConnection:
    """One ACP connection opened by :meth:`AcpHarness.open_connection`: its ``client``, and
    :meth:`disconnect`."""

    def __init__(self, client: AcpTestClient) -> None:
        self.client = client
        self.alive = True
        self._stop = trio.Event()
        self._finished = trio.Event()

    async def disconnect(self) -> float:
        """Close the client's end and return once the service finished this connection's
        cleanup, with the virtual seconds that took (the library's bound is five; under a
        frozen clock a cleanup that waits for a deadline blocks until the clock moves)."""
        started = trio.current_time()
        self.alive = False
        self._stop.set()
        await self._finished.wait()
        return trio.current_time() - started


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
        """One ACP connection; ``client_options`` go to :func:`open_acp_client` (a
        ``permission`` policy, a ``schema`` every frame is checked against, ...)."""
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

    async def open_connection(
        self, *, initialize: bool = False, **client_options: Any
    ) -> HarnessConnection:
        """:meth:`connect` without a ``with`` block: the connection lives in the harness's
        nursery until :meth:`HarnessConnection.disconnect` (or the harness ends)."""

        async def hold(*, task_status: trio.TaskStatus[HarnessConnection]) -> None:
            connection: HarnessConnection | None = None
            try:
                async with self.connect(initialize=initialize, **client_options) as client:
                    connection = HarnessConnection(client)
                    task_status.started(connection)
                    await connection._stop.wait()
            finally:
                if connection is not None:
                    connection.alive = False
                    connection._finished.set()

        connection: HarnessConnection = await self._nursery.start(hold)
        return connection


@asynccontextmanager
async def running_acp(
    directory: str | os.PathLike[str],
    *,
    backend: AgentBackend,
    catalog: ModelCatalog,
    policy: PermissionPolicy,
    config: AcpServiceConfig | None = None,
    account: str = DEMO_ACCOUNT,
    harness_type: type[AcpHarness] = AcpHarness,
    hold_clock: Callable[[Any], Any] = VirtualTimeStore,
    **runtime_options: Any,
) -> AsyncIterator[AcpHarness]:
    """The host's ``backend``, ``catalog`` and ``policy`` in a runtime signed in as
    ``account``, over a store in ``directory/data``, and an ``AcpService`` on it.

    ``runtime_options`` go to ``AgentService`` (``provisional_grace_s``,
    ``relay_allow_list``, ``modes``, ...). The store is wrapped in ``hold_clock``
    (:class:`~maple_acp.testing.clock.VirtualTimeStore`, or ``ClockHoldingStore`` for tests
    that queue many store calls), so deadline tests may use a mock clock with a zero autojump
    threshold. ``harness_type`` lets a test suite add its own helpers.

    Resource handling: leaving the block cancels every connection still open, then stops the
    runtime and closes the store."""
    data = Path(directory) / "data"
    data.mkdir(exist_ok=True)
    ignore_present_children()
    async with temp_store(data) as store:
        runtime_options.setdefault("installation_id", "test")
        runtime = AgentService(
            store=hold_clock(store),
            backend=backend,
            catalog=catalog,
            policy=policy,
            **runtime_options,
        )
        async with runtime, trio.open_nursery() as nursery:
            runtime.sign_in(account)
            acp = AcpService(runtime, config or AcpServiceConfig())
            yield harness_type(runtime, acp, nursery, data / STORE_FILE_NAME)
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def running_demo_acp(
    directory: str | os.PathLike[str],
    *,
    backend: AgentBackend | None = None,
    catalog: ModelCatalog | None = None,
    policy: PermissionPolicy | None = None,
    **options: Any,
) -> AsyncIterator[AcpHarness]:
    """:func:`running_acp` over the demo backend, its catalog and its policy (each may be
    replaced); ``options`` are :func:`running_acp`'s."""
    async with running_acp(
        directory,
        backend=backend or DemoBackend(),
        catalog=catalog or demo_catalog(),
        policy=policy or demo_policy(),
        **options,
    ) as harness:
        yield harness
