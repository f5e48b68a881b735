"""The provider's model catalog: configured models, discovery from ``GET /models`` (real
loopback server, bounded), and a retired model refused rather than substituted."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from loopback import LoopbackProvider, Reply, error_reply, text_reply
from provider_support import TEST_KEY

from maple_acp.backends import build_backend, load_provider_config, provider_policy
from maple_acp.runtime import (
    MODEL_DISCOVERY_BOUND_S,
    AgentService,
    RejectionKind,
    RunState,
    RuntimeRejection,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service, run_prompt
from maple_acp.testing.store import temp_store


def discovering(provider: LoopbackProvider) -> Any:
    raw = {
        "providers": [
            {"name": "lab", "base_url": provider.base_url, "api_key_env": "LAB_KEY"},
        ],
        "default_model": "lab/llama3",
    }
    return load_provider_config(raw, "test.toml")


def model_list(*ids: str) -> Reply:
    return Reply(
        body={
            "object": "list",
            "data": [{"id": i, "object": "model", "created": 0, "owned_by": "x"} for i in ids],
        }
    )


async def test_models_are_discovered_when_none_are_listed(provider: LoopbackProvider) -> None:
    provider.models = model_list("llama3", "qwen2.5-coder", "nomic-embed-text")
    _, catalog = build_backend(discovering(provider), {"LAB_KEY": TEST_KEY})
    models = await catalog.list_models("account")
    assert [(m.id, m.chat) for m in models] == [
        ("lab/llama3", True),
        ("lab/qwen2.5-coder", True),
        ("lab/nomic-embed-text", False),
    ]
    (request,) = provider.requests
    assert (request.method, request.path) == ("GET", "/v1/models")
    assert request.headers["authorization"] == f"Bearer {TEST_KEY}"


async def test_a_failed_discovery_lists_nothing_and_logs_no_secret(
    provider: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    provider.models = error_reply(401, f"bad key {TEST_KEY}")
    _, catalog = build_backend(discovering(provider), {"LAB_KEY": TEST_KEY})
    with caplog.at_level(logging.DEBUG):
        assert await catalog.list_models("account") == []
    assert 'could not list the models of provider "lab"' in caplog.text
    assert "HTTP 401" in caplog.text
    assert TEST_KEY not in caplog.text
    assert catalog.default_model("account").id == "lab/llama3"


async def test_a_stalled_discovery_ends_within_its_bound(
    provider: LoopbackProvider, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0
    provider.models = Reply(stall=True)
    _, catalog = build_backend(discovering(provider), {"LAB_KEY": TEST_KEY})
    start = trio.current_time()
    assert await catalog.list_models("account") == []
    assert trio.current_time() - start <= MODEL_DISCOVERY_BOUND_S + 1


@asynccontextmanager
async def service_with(
    tmp_path: Path, provider: LoopbackProvider, models: list[str]
) -> AsyncIterator[AgentService]:
    raw = {"providers": [{"name": "lab", "base_url": provider.base_url, "models": models}]}
    backend, catalog = build_backend(load_provider_config(raw, "test.toml"), {})
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    async with temp_store(data) as store:
        service = make_demo_service(
            store, backend=backend, catalog=catalog, policy=provider_policy()
        )
        async with service:
            service.sign_in(DEMO_ACCOUNT)
            yield service


async def test_a_model_that_left_the_configuration_is_refused_not_substituted(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(text_reply("from big"))
    async with (
        service_with(tmp_path, provider, ["small", "big"]) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(service.serve_new_task, str(project))
        await service.model_choices(refresh=True)
        await lease.set_model("lab/big")
        _, outcome = await run_prompt(lease, "hi")
        task_id = lease.task_id
        await lease.release(close=False)
    assert outcome.state is RunState.COMPLETED
    assert provider.chat_requests()[0].body["model"] == "big"
    async with service_with(tmp_path, provider, ["small"]) as service:
        await service.model_choices(refresh=True)
        async with trio.open_nursery() as nursery:
            with pytest.raises(RuntimeRejection) as caught:
                await nursery.start(service.serve_task, task_id, str(project))
    assert caught.value.kind is RejectionKind.MODEL_RETIRED
    assert len(provider.chat_requests()) == 1
