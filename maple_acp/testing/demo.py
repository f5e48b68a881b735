"""A ready-made runtime for hosts' tests: the demo backend, its static catalog and policy, and a
real SQLite store in a temporary directory.

::

    async def test_echo(tmp_path):
        async with demo_service(tmp_path) as service:
            async with trio.open_nursery() as nursery:
                lease = await nursery.start(service.serve_new_task, str(tmp_path))
                events, outcome = await run_prompt(lease, "hello")
                await lease.release(close=True)
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.runtime import (
    DEFAULT_PROVISIONAL_GRACE_S,
    AgentBackend,
    AgentService,
    ModelCatalog,
    PermissionPolicy,
    Run,
    RunEvent,
    RunOutcome,
    SessionLease,
)
from maple_acp.store import TaskStore
from maple_acp.testing.store import temp_store

#: The account ``demo_service`` signs in.
DEMO_ACCOUNT = "demo-account"


def make_demo_service(
    store: TaskStore,
    *,
    backend: AgentBackend | None = None,
    catalog: ModelCatalog | None = None,
    policy: PermissionPolicy | None = None,
    provisional_grace_s: float = DEFAULT_PROVISIONAL_GRACE_S,
    relay_allow_list: Collection[str] = (),
) -> AgentService:
    """An ``AgentService`` over ``store`` with the demo parts (not yet serving)."""
    return AgentService(
        store=store,
        backend=backend or DemoBackend(),
        catalog=catalog or demo_catalog(),
        policy=policy or demo_policy(),
        installation_id="test",
        provisional_grace_s=provisional_grace_s,
        relay_allow_list=relay_allow_list,
    )


@asynccontextmanager
async def demo_service(
    directory: str | os.PathLike[str],
    *,
    account: str | None = DEMO_ACCOUNT,
    backend: AgentBackend | None = None,
    catalog: ModelCatalog | None = None,
    policy: PermissionPolicy | None = None,
    provisional_grace_s: float = DEFAULT_PROVISIONAL_GRACE_S,
    relay_allow_list: Collection[str] = (),
) -> AsyncIterator[AgentService]:
    """A serving demo ``AgentService`` over a store file in ``directory``, signed in as
    ``account`` (unless ``None``). The store and the service stop when the block ends."""
    async with temp_store(directory) as store:
        service = make_demo_service(
            store,
            backend=backend,
            catalog=catalog,
            policy=policy,
            provisional_grace_s=provisional_grace_s,
            relay_allow_list=relay_allow_list,
        )
        async with service:
            if account is not None:
                service.sign_in(account)
            yield service


async def collect_events(run: Run) -> list[RunEvent]:
    """Every event of ``run`` up to and including ``RunEnded``."""
    return [event async for event in run.events()]


async def run_prompt(lease: SessionLease, text: str) -> tuple[list[RunEvent], RunOutcome]:
    """Start a run for ``text``, read all its events, and return them with its outcome."""
    run = await lease.start_run(text)
    events = await collect_events(run)
    return events, await run.wait()
