"""Helpers the provider tests share: the test key, a runtime whose backend talks to a
loopback provider, and one turn on a fresh lease. A module of its own (not the conftest) so
that tests can import it by a name no other test directory uses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from loopback import LoopbackProvider

from maple_acp.backends import (
    build_backend,
    provider_config_from_flags,
    provider_policy,
)
from maple_acp.runtime import (
    AgentService,
    PermissionRequest,
    RunEvent,
    RunOutcome,
    SessionLease,
)
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.demo import DEMO_ACCOUNT, collect_events, make_demo_service
from maple_acp.testing.store import temp_store

#: The key the tests configure; every secrecy test searches for it.
TEST_KEY = "sk-test-9f8e7d6c5b4a39281706f5e4d3c2b1a0"


@asynccontextmanager
async def provider_service(
    tmp_path: Path,
    provider: LoopbackProvider,
    *,
    context_window: int | None = None,
    relay_allow_list: tuple[str, ...] = (),
    max_rate_limit_wait: float | None = None,
    hold_clock: Callable[[Any], Any] | None = None,
    **backend_options: Any,
) -> AsyncIterator[AgentService]:
    """A signed-in ``AgentService`` with the provider backend (model ``provider/test-model``,
    key ``TEST_KEY``) over a store in ``tmp_path/data`` (seen through ``hold_clock``, e.g.
    ``ClockHoldingStore``, when given)."""
    config = provider_config_from_flags(
        provider.base_url,
        "test-model",
        api_key_env="TEST_PROVIDER_KEY",
        context_window=context_window,
        max_rate_limit_wait=max_rate_limit_wait,
    )
    backend, catalog = build_backend(config, {"TEST_PROVIDER_KEY": TEST_KEY}, **backend_options)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    async with backend, temp_store(data) as store:
        service = make_demo_service(
            store if hold_clock is None else hold_clock(store),
            backend=backend,
            catalog=catalog,
            policy=provider_policy(),
            relay_allow_list=relay_allow_list,
        )
        async with service:
            service.sign_in(DEMO_ACCOUNT)
            yield service


async def open_lease(service: AgentService, project: Path, nursery: trio.Nursery) -> SessionLease:
    return await nursery.start(service.serve_new_task, str(project))


async def answering(run: Any, answer: str) -> list[RunEvent]:
    """Every event of ``run``, answering each permission request with ``answer``."""
    events = []
    async for event in run.events():
        events.append(event)
        if isinstance(event, PermissionRequest):
            event.responder.answer(answer)
    return events


async def one_turn(
    service: AgentService, project: Path, prompt: str, *, answer: str | None = None
) -> tuple[list[RunEvent], RunOutcome]:
    """One run of ``prompt`` on a new lease of ``project``, released afterwards; with ``answer``
    every permission request is answered so, without it none is expected."""
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run(prompt)
        events = await (collect_events(run) if answer is None else answering(run, answer))
        outcome = await run.wait()
        await lease.release(close=False)
    return events, outcome


async def cancel_while_streaming(
    client: AcpTestClient, session_id: str, provider: LoopbackProvider, streamed: str
) -> Any:
    """Prompt, and cancel once ``streamed`` has reached the client while the provider still
    streams; the provider must see its connection closed within a second. Returns the
    prompt's answer."""
    answers: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def prompt() -> None:
            answers.append(await client.prompt(session_id, "go"))

        nursery.start_soon(prompt)
        await client.wait_until(lambda: client.text(session_id) == streamed)
        await provider.streaming.wait()
        closed = provider.closed_event
        await client.cancel(session_id)
        with trio.fail_after(1):
            await closed.wait()
    return answers[0]
