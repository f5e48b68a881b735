"""Per-model settings in the provider configuration, the thinking levels they give a reasoning
model, the ``reasoning_effort`` each request then carries, and the session mode's hold on the
tools the model is offered; against the loopback provider through the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from loopback import LoopbackProvider, text_reply, tool_call_reply
from provider_support import TEST_KEY, answering

from maple_acp.backends import (
    ModelPrices,
    ModelSettings,
    ProviderConfigError,
    build_backend,
    load_provider_config,
    provider_policy,
)
from maple_acp.backends.openai._compaction import SUMMARY_MAX_TOKENS
from maple_acp.runtime import (
    AgentService,
    PermissionRequest,
    RejectionKind,
    RuntimeRejection,
    SessionLease,
    ToolRow,
    ToolStatus,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.store import temp_store

SOURCE = "config.toml"

MODELS: list[Any] = [
    "gpt-4.1",
    {"id": "o4-mini", "reasoning": True},
    {
        "id": "gpt-4o",
        "vision": True,
        "context_window": 128000,
        "prices": {"input": 2.5, "output": 10.0, "cache_read": 1.25, "cache_write": 0.0},
    },
]


def raw_config(base_url: str = "http://127.0.0.1:9/v1", models: Any = None) -> dict[str, Any]:
    return {
        "providers": [
            {
                "name": "p",
                "base_url": base_url,
                "api_key_env": "TEST_PROVIDER_KEY",
                "models": MODELS if models is None else models,
            }
        ],
        "default_model": "p/o4-mini",
    }


def test_models_may_be_ids_or_tables_and_keep_their_settings() -> None:
    entry = load_provider_config(raw_config(), SOURCE).providers[0]
    assert entry.models == ("gpt-4.1", "o4-mini", "gpt-4o")
    assert entry.settings_for("gpt-4.1") == ModelSettings(id="gpt-4.1")
    assert entry.settings_for("o4-mini") == ModelSettings(id="o4-mini", reasoning=True)
    assert entry.settings_for("gpt-4o") == ModelSettings(
        id="gpt-4o",
        vision=True,
        context_window=128000,
        prices=ModelPrices(input=2.5, output=10.0, cache_read=1.25, cache_write=0.0),
    )
    assert entry.settings_for("unlisted") is None


@pytest.mark.parametrize(
    ("model", "key", "what"),
    [
        ({"id": "m", "think": True}, "providers[0].models[0].think", "is not a model setting"),
        ({"reasoning": True}, "providers[0].models[0].id", "is required"),
        ({"id": " m"}, "providers[0].models[0].id", "non-blank"),
        ({"id": "m", "reasoning": "yes"}, "providers[0].models[0].reasoning", "true or false"),
        ({"id": "m", "vision": 1}, "providers[0].models[0].vision", "true or false"),
        ({"id": "m", "context_window": 0}, "providers[0].models[0].context_window", "positive"),
        ({"id": "m", "prices": 3}, "providers[0].models[0].prices", "must be a table"),
        ({"id": "m", "prices": {"input": 1}}, "providers[0].models[0].prices.output", "required"),
        (
            {"id": "m", "prices": {"input": 1, "output": -1}},
            "providers[0].models[0].prices.output",
            "at least 0",
        ),
        (
            {"id": "m", "prices": {"input": 1, "output": 1, "tip": 1}},
            "providers[0].models[0].prices.tip",
            "is not a price",
        ),
        (7, "providers[0].models[0]", "a model name or a table"),
    ],
)
def test_a_bad_model_entry_is_one_line_naming_its_key(model: Any, key: str, what: str) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw_config(models=[model]) | {"default_model": "p/x"}, SOURCE)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"{SOURCE}: {key}: ")
    assert what in text


def test_an_id_listed_as_a_string_and_as_a_table_is_listed_twice() -> None:
    with pytest.raises(ProviderConfigError, match=r"models\[1\]: 'm' is listed twice"):
        load_provider_config(
            raw_config(models=["m", {"id": "m"}]) | {"default_model": "p/m"}, SOURCE
        )


@asynccontextmanager
async def reasoning_service(
    tmp_path: Path, provider: LoopbackProvider
) -> AsyncIterator[AgentService]:
    config = load_provider_config(raw_config(provider.base_url), SOURCE)
    backend, catalog = build_backend(config, {"TEST_PROVIDER_KEY": TEST_KEY})
    assert backend.thought_levels("p/o4-mini") == ("low", "medium", "high")
    assert backend.thought_levels("p/gpt-4.1") == ()
    assert backend.thought_levels(None) == ("low", "medium", "high")
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


async def test_the_chosen_level_goes_with_each_request_of_a_reasoning_model(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    (project / "a.txt").write_text("alpha\n")
    provider.add(
        text_reply("default"),
        tool_call_reply(("c1", "read_file", {"path": "a.txt"})),
        text_reply("read it"),
    )
    async with reasoning_service(tmp_path, provider) as service, trio.open_nursery() as nursery:
        lease = await new_lease(service, project, nursery, "p/o4-mini")
        assert lease.thought_levels == ("low", "medium", "high")
        await answering(await lease.start_run("first"), "deny_once")
        await lease.set_thought_level("high")
        await answering(await lease.start_run("second"), "deny_once")
        await lease.release()
    bodies = [request.body for request in provider.chat_requests()]
    assert "reasoning_effort" not in bodies[0]
    # Every request of the turn carries it, the one after the tool call too.
    assert [body.get("reasoning_effort") for body in bodies[1:]] == ["high", "high"]


async def test_a_plain_model_offers_no_levels_and_sends_none(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    provider.add(text_reply("plain"))
    async with reasoning_service(tmp_path, provider) as service, trio.open_nursery() as nursery:
        lease = await new_lease(service, project, nursery, "p/gpt-4.1")
        assert lease.thought_levels == ()
        with pytest.raises(RuntimeRejection) as caught:
            await lease.set_thought_level("high")
        assert caught.value.kind is RejectionKind.UNKNOWN_THOUGHT_LEVEL
        await answering(await lease.start_run("hello"), "deny_once")
        await lease.release()
    (body,) = [request.body for request in provider.chat_requests()]
    assert "reasoning_effort" not in body


@pytest.mark.parametrize(
    ("model", "bound"), [("p/o4-mini", "max_completion_tokens"), ("p/gpt-4.1", "max_tokens")]
)
async def test_a_summary_is_bounded_in_the_key_the_model_takes(
    tmp_path: Path, project: Path, provider: LoopbackProvider, model: str, bound: str
) -> None:
    # OpenAI's reasoning models answer 400 to max_tokens: a summary asked of one with it
    # would fail, and the session would never be compacted.
    provider.add(text_reply("hello"), text_reply("the summary"))
    async with reasoning_service(tmp_path, provider) as service, trio.open_nursery() as nursery:
        lease = await new_lease(service, project, nursery, model)
        await answering(await lease.start_run("hi"), "deny_once")
        await answering(await lease.start_run("/compact"), "deny_once")
        await lease.release()
    first, summary = [request.body for request in provider.chat_requests()]
    other = {"max_tokens", "max_completion_tokens"} - {bound}
    assert not {"max_tokens", "max_completion_tokens"} & first.keys()
    assert summary[bound] == SUMMARY_MAX_TOKENS
    assert not other & summary.keys()


def offered_names(body: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools", [])]


async def test_the_mode_decides_the_tools_offered_and_refuses_a_write_without_asking(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    provider.add(
        tool_call_reply(("c1", "write_file", {"path": "w.txt", "content": "x"})),
        text_reply("could not"),
        text_reply("my plan"),
        text_reply("coding"),
    )
    async with reasoning_service(tmp_path, provider) as service, trio.open_nursery() as nursery:
        lease = await new_lease(service, project, nursery, "p/gpt-4.1")
        await lease.set_mode("ask")
        events = await answering(await lease.start_run("write it"), "allow_once")
        await lease.set_mode("plan")
        await answering(await lease.start_run("plan it"), "allow_once")
        await lease.set_mode("code")
        await answering(await lease.start_run("do it"), "allow_once")
        await lease.release()
    bodies = [request.body for request in provider.chat_requests()]
    # ``delegate`` in every mode: a child inherits the mode, and its own calls meet it.
    assert offered_names(bodies[0]) == ["read_file", "delegate"]
    assert offered_names(bodies[2]) == ["read_file", "update_plan", "delegate"]
    assert offered_names(bodies[3]) == [
        "shell",
        "shell_output",
        "shell_kill",
        "read_file",
        "write_file",
        "edit_file",
        "update_plan",
        "delegate",
    ]
    assert "plan mode" in bodies[2]["messages"][0]["content"]
    assert "plan mode" not in bodies[3]["messages"][0]["content"]
    assert not any(isinstance(event, PermissionRequest) for event in events)
    rows = [event.tool for event in events if isinstance(event, ToolRow)]
    assert rows[-1].status is ToolStatus.FAILED
    assert "Ask mode" in (rows[-1].output_text or "")
    # The model is told why, and nothing was written.
    assert "Ask mode" in bodies[1]["messages"][-1]["content"]
    assert not (project / "w.txt").exists()
