"""Images and embedded text resources through the provider backend, against the loopback
provider through the real SDK: a model marked ``vision = true`` gets each image as a data URL
(this turn's and the history's), one that is not refuses the prompt naming the model, and the
backend declares what it takes."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from loopback import LoopbackProvider, text_reply
from provider_support import TEST_KEY, answering

from maple_acp.backends import build_backend, load_provider_config, provider_policy
from maple_acp.runtime import (
    AgentService,
    Prompt,
    PromptCapabilities,
    RejectionKind,
    RuntimeRejection,
    SessionLease,
    check_embedded_text,
    check_image,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.images import jpeg, png
from maple_acp.testing.store import temp_store


def config(base_url: str, models: list[Any]) -> dict[str, Any]:
    return {
        "providers": [{"name": "p", "base_url": base_url, "api_key_env": "KEY", "models": models}],
        "default_model": "p/eyes",
    }


@asynccontextmanager
async def vision_service(
    tmp_path: Path, provider: LoopbackProvider, models: list[Any]
) -> AsyncIterator[AgentService]:
    loaded = load_provider_config(config(provider.base_url, models), "config.toml")
    backend, catalog = build_backend(loaded, {"KEY": TEST_KEY})
    data = tmp_path / "data"
    data.mkdir()
    async with temp_store(data) as store:
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


def data_url(data: bytes, mime_type: str) -> str:
    return f"data:{mime_type};base64,{base64.b64encode(data).decode()}"


async def test_images_go_to_a_seeing_model_as_data_urls_this_turn_and_later(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    picture, photo = png(2, 3), jpeg(4, 5)
    provider.add(text_reply("a chart"), text_reply("still a chart"))
    models = [{"id": "eyes", "vision": True}, "blind"]
    async with (
        vision_service(tmp_path, provider, models) as service,
        trio.open_nursery() as nursery,
    ):
        assert service.prompt_capabilities == PromptCapabilities(image=True, embedded_context=True)
        lease = await new_lease(service, project, nursery, "p/eyes")
        images = [check_image(picture, "image/png"), check_image(photo, "image/jpeg")]
        await answering(await lease.start_run(Prompt("what is this?", tuple(images))), "deny_once")
        await answering(await lease.start_run("and now?"), "deny_once")
        await lease.release()
    first, second = (request.body["messages"] for request in provider.chat_requests())
    expected_user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": data_url(picture, "image/png")}},
            {"type": "image_url", "image_url": {"url": data_url(photo, "image/jpeg")}},
        ],
    }
    assert first[-1] == expected_user
    # The next turn's history carries the images again, read back from the store.
    assert second[1] == expected_user
    assert second[-1] == {"role": "user", "content": "and now?"}


async def test_an_image_for_a_model_without_vision_is_refused_naming_it(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    models = [{"id": "eyes", "vision": True}, "blind"]
    async with (
        vision_service(tmp_path, provider, models) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await new_lease(service, project, nursery, "p/blind")
        with pytest.raises(RuntimeRejection) as refused:
            await lease.start_run(Prompt("see", (check_image(png(), "image/png"),)))
        assert refused.value.kind is RejectionKind.INVALID_PROMPT
        assert "p/blind does not accept images" in refused.value.message
        assert await service.store.item_count(lease.task_id) == 0
        await lease.release()
    assert provider.chat_requests() == []


async def test_without_a_seeing_model_only_embedded_text_is_declared(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    provider.add(text_reply("read it"))
    async with (
        vision_service(tmp_path, provider, ["eyes"]) as service,
        trio.open_nursery() as nursery,
    ):
        assert service.prompt_capabilities == PromptCapabilities(embedded_context=True)
        lease = await new_lease(service, project, nursery, "p/eyes")
        resource = check_embedded_text("file:///a.py", "print(1)")
        prompt = f"explain\n\n{resource.rendered}"
        await answering(await lease.start_run(Prompt(prompt, resources=(resource,))), "deny_once")
        await lease.release()
    [request] = provider.chat_requests()
    assert request.body["messages"][-1] == {
        "role": "user",
        "content": 'explain\n\n<resource uri="file:///a.py">\nprint(1)\n</resource>',
    }
