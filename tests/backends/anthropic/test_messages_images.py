"""Images through the Anthropic engine, against the loopback Messages server through the real
SDK: a model marked ``vision = true`` gets each image as a base64 ``image`` block (this turn's,
and the history's read back from the store in a later turn), one that is not refuses the
prompt naming the model, and the engine declares what it takes."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from anthropic_support import KEY_ENV, TEST_KEY
from messages_loopback import MessagesProvider, text_reply

from maple_acp.backends import build_backend, load_provider_config, provider_policy
from maple_acp.runtime import (
    AgentService,
    Prompt,
    PromptCapabilities,
    RejectionKind,
    RunState,
    RuntimeRejection,
    SessionLease,
    check_image,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, collect_events, make_demo_service, run_prompt
from maple_acp.testing.images import jpeg, png
from maple_acp.testing.store import temp_store


@asynccontextmanager
async def vision_service(
    tmp_path: Path, provider: MessagesProvider, models: list[Any]
) -> AsyncIterator[AgentService]:
    raw = {
        "providers": [
            {
                "name": "claude",
                "kind": "anthropic",
                "base_url": provider.base_url,
                "api_key_env": KEY_ENV,
                "models": models,
            }
        ],
        "default_model": "claude/eyes",
    }
    backend, catalog = build_backend(
        load_provider_config(raw, "config.toml"), {KEY_ENV: TEST_KEY}, backoff=(0.0,)
    )
    data = tmp_path / "data"
    data.mkdir()
    async with backend, temp_store(data) as store:
        service = make_demo_service(
            store, backend=backend, catalog=catalog, policy=provider_policy()
        )
        async with service:
            service.sign_in(DEMO_ACCOUNT)
            yield service


async def new_lease(
    service: AgentService, project: Path, nursery: trio.Nursery, model: str
) -> SessionLease:
    lease: SessionLease = await nursery.start(
        lambda task_status: service.serve_new_task(
            str(project), model=model, task_status=task_status
        )
    )
    return lease


def image_block(data: bytes, mime_type: str) -> dict[str, Any]:
    source = {"type": "base64", "media_type": mime_type, "data": base64.b64encode(data).decode()}
    return {"type": "image", "source": source}


async def test_images_go_to_a_seeing_model_as_base64_blocks_this_turn_and_later(
    tmp_path: Path, project: Path, messages_provider: MessagesProvider
) -> None:
    picture, photo = png(2, 3), jpeg(4, 5)
    messages_provider.add(text_reply("a chart"), text_reply("still a chart"))
    models = [{"id": "eyes", "vision": True}, "blind"]
    async with (
        vision_service(tmp_path, messages_provider, models) as service,
        trio.open_nursery() as nursery,
    ):
        assert service.prompt_capabilities == PromptCapabilities(image=True, embedded_context=True)
        lease = await new_lease(service, project, nursery, "claude/eyes")
        images = [check_image(picture, "image/png"), check_image(photo, "image/jpeg")]
        run = await lease.start_run(Prompt("what is this?", tuple(images)))
        await collect_events(run)
        assert (await run.wait()).state is RunState.COMPLETED
        _, outcome = await run_prompt(lease, "and now?")
        assert outcome.state is RunState.COMPLETED
        await lease.release()
    first, second = (r.body["messages"] for r in messages_provider.message_requests())
    expected = [
        {"type": "text", "text": "what is this?"},
        image_block(picture, "image/png"),
        image_block(photo, "image/jpeg"),
    ]
    # The request's latest block carries the cache breakpoint.
    assert first[-1]["content"][:-1] == expected[:-1]
    assert first[-1]["content"][-1] == {**expected[-1], "cache_control": {"type": "ephemeral"}}
    # The next turn's history carries the images again, read back from the store.
    assert second[0] == {"role": "user", "content": expected}
    assert second[-1]["content"][0]["text"] == "and now?"


async def test_an_image_for_a_model_without_vision_is_refused_naming_it(
    tmp_path: Path, project: Path, messages_provider: MessagesProvider
) -> None:
    models = [{"id": "eyes", "vision": True}, "blind"]
    async with (
        vision_service(tmp_path, messages_provider, models) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await new_lease(service, project, nursery, "claude/blind")
        with pytest.raises(RuntimeRejection) as refused:
            await lease.start_run(Prompt("see", (check_image(png(), "image/png"),)))
        assert refused.value.kind is RejectionKind.INVALID_PROMPT
        assert "claude/blind does not accept images" in refused.value.message
        assert await service.store.item_count(lease.task_id) == 0
        await lease.release()
    assert messages_provider.message_requests() == []


async def test_without_a_seeing_model_only_embedded_text_is_declared(
    tmp_path: Path, messages_provider: MessagesProvider
) -> None:
    async with vision_service(tmp_path, messages_provider, ["eyes"]) as service:
        assert service.prompt_capabilities == PromptCapabilities(embedded_context=True)
