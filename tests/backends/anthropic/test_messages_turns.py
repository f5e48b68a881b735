"""The Anthropic backend's requests as the server reads them: thinking kept with its signature
and sent back intact within the turn's tool loop, the thinking budget of the chosen level,
prompt-cache breakpoints, the tools in the Messages shape; and the configuration of a provider's
``kind`` (bad forms, the command-line flag, a configuration mixing engines)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from anthropic_support import KEY_ENV, TEST_KEY, messages_service
from messages_loopback import MessagesProvider, Reply, text_reply, tool_reply

from maple_acp.backends import (
    ProviderConfigError,
    build_backend,
    load_provider_config,
    provider_config_from_flags,
)
from maple_acp.backends import provider_policy as policy
from maple_acp.runtime import (
    AgentService,
    PermissionRequest,
    RunState,
    SessionLease,
    TextChunk,
    ThoughtChunk,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service, run_prompt
from maple_acp.testing.store import temp_store


async def new_lease(service: AgentService, project: Path, nursery: trio.Nursery) -> SessionLease:
    lease: SessionLease = await nursery.start(service.serve_new_task, str(project))
    return lease


async def test_thinking_and_its_signature_go_back_intact_within_the_tool_loop(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    (project / "a.txt").write_text("alpha\n")
    messages_provider.add(
        tool_reply(
            ("toolu_1", "read_file", {"path": "a.txt"}),
            thinking=("I should read a.txt", "c2lnbmF0dXJlLW9uZQ=="),
            text="Looking.",
        ),
        text_reply("It says alpha."),
    )
    async with (
        messages_service(tmp_path, messages_provider) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await new_lease(service, project, nursery)
        assert lease.thought_levels == ("low", "medium", "high")
        await lease.set_thought_level("high")
        events, outcome = await run_prompt(lease, "read it")
        await lease.release()
    assert outcome.state is RunState.COMPLETED
    thoughts = "".join(e.text for e in events if isinstance(e, ThoughtChunk))
    assert thoughts == "I should read a.txt"
    first, second = (r.body for r in messages_provider.message_requests())
    for body in (first, second):
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 24576}
        assert body["max_tokens"] == 24576 + 8192
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    thinking, text, use = assistant["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": "I should read a.txt",
        "signature": "c2lnbmF0dXJlLW9uZQ==",
    }
    assert text == {"type": "text", "text": "Looking."}
    assert use == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "read_file",
        "input": {"path": "a.txt"},
    }
    [result] = second["messages"][2]["content"]
    assert result["tool_use_id"] == "toolu_1"
    assert result["content"] == "alpha\n"


async def test_no_thinking_is_asked_for_without_a_chosen_level(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(text_reply("plain"))
    async with (
        messages_service(tmp_path, messages_provider) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await new_lease(service, project, nursery)
        await run_prompt(lease, "hi")
        await lease.release()
    [request] = messages_provider.message_requests()
    assert "thinking" not in request.body
    assert request.body["max_tokens"] == 8192


async def test_cache_breakpoints_mark_system_tools_and_the_latest_turn_only(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(
        tool_reply(("toolu_1", "shell", {"command": "true"})),
        text_reply("done"),
    )
    async with (
        messages_service(tmp_path, messages_provider) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await new_lease(service, project, nursery)
        run = await lease.start_run("go")
        async for event in run.events():
            if isinstance(event, PermissionRequest):
                event.responder.answer("deny_once")
        await run.wait()
        await lease.release()
    ephemeral = {"type": "ephemeral"}
    for request in messages_provider.message_requests():
        body = request.body
        [system] = body["system"]
        assert system["cache_control"] == ephemeral
        assert "project directory" in system["text"]
        tools = body["tools"]
        assert {"shell", "read_file", "write_file", "edit_file"} <= {t["name"] for t in tools}
        assert all("input_schema" in t for t in tools)
        assert [t.get("cache_control") for t in tools] == [None] * (len(tools) - 1) + [ephemeral]
        marked = [
            (m_index, b_index)
            for m_index, message in enumerate(body["messages"])
            for b_index, block in enumerate(message["content"])
            if "cache_control" in block
        ]
        last = len(body["messages"]) - 1
        assert marked == [(last, len(body["messages"][last]["content"]) - 1)]
    assert len(messages_provider.message_requests()) == 2


def anthropic_raw(**extra: Any) -> dict[str, Any]:
    return {
        "providers": [
            {"name": "c", "base_url": "https://api.example.invalid/v1", "models": ["m"], **extra}
        ]
    }


def test_the_kind_defaults_to_openai_and_a_bad_kind_is_one_line() -> None:
    assert load_provider_config(anthropic_raw(), "f").providers[0].kind == "openai"
    assert load_provider_config(anthropic_raw(kind="anthropic"), "f").providers[0].kind == (
        "anthropic"
    )
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(anthropic_raw(kind="Anthropic"), "f")
    assert str(caught.value) == (
        "f: providers[0].kind: 'Anthropic' is not an installed engine kind (installed: "
        "'anthropic', 'openai'); install the package that provides it"
    )
    for bad in (3, ["anthropic"]):
        with pytest.raises(ProviderConfigError) as caught:
            load_provider_config(anthropic_raw(kind=bad), "f")
        assert str(caught.value) == (
            "f: providers[0].kind: must be the name of an engine kind, such as 'openai'"
        )
    with pytest.raises(
        ProviderConfigError, match=r"^the command line: --provider-kind: 'nope' is not an installed"
    ):
        provider_config_from_flags("http://127.0.0.1:9/v1", "m", kind="nope")


async def test_a_configuration_mixing_engines_routes_each_turn_by_its_provider(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    raw = {
        "providers": [
            {
                "name": "claude",
                "kind": "anthropic",
                "base_url": messages_provider.base_url,
                "api_key_env": KEY_ENV,
                "models": [{"id": "test-model", "reasoning": True}],
            },
            # The same loopback server, spoken to as Chat Completions.
            {"name": "local", "base_url": messages_provider.base_url, "models": ["plain"]},
        ]
    }
    config = load_provider_config(raw, "test config")
    backend, catalog = build_backend(config, {KEY_ENV: TEST_KEY}, backoff=(0.0,))
    assert backend.thought_levels("claude/test-model") == ("low", "medium", "high")
    assert backend.thought_levels("local/plain") == ()
    assert backend.thought_levels("gone/x") == ()
    # Both engines compact: the router offers their one command once.
    assert [c.name for c in backend.available_commands()] == ["compact"]
    chat_chunk = {
        "type": "chunk",
        "choices": [{"index": 0, "delta": {"content": "from chat"}, "finish_reason": "stop"}],
    }
    messages_provider.add(
        text_reply("from messages"), Reply(events=[chat_chunk, "data: [DONE]\n\n"])
    )
    texts = []
    data = tmp_path / "data"
    data.mkdir()
    async with backend, temp_store(data) as store:
        service = make_demo_service(store, backend=backend, catalog=catalog, policy=policy())
        async with service, trio.open_nursery() as nursery:
            service.sign_in(DEMO_ACCOUNT)
            for model in ("claude/test-model", "local/plain"):
                lease: SessionLease = await nursery.start(
                    lambda task_status, model=model: service.serve_new_task(
                        str(project), model=model, task_status=task_status
                    )
                )
                events, outcome = await run_prompt(lease, "hi")
                assert outcome.state is RunState.COMPLETED, outcome.failure
                texts.append("".join(e.text for e in events if isinstance(e, TextChunk)))
                await lease.release()
    assert texts == ["from messages", "from chat"]
    assert [r.path for r in messages_provider.requests if r.method == "POST"] == [
        "/v1/messages",
        "/v1/chat/completions",
    ]


def test_serve_flags_choose_the_anthropic_engine(tmp_path: Path) -> None:
    from maple_acp.backends.anthropic import AnthropicBackend
    from maple_acp.backends.openai._backend import ProviderBackend
    from maple_acp.cli import provider_engine
    from maple_acp.config import parse_config

    config = parse_config("", tmp_path / "config.toml")
    url = "http://127.0.0.1:9/v1"
    for kind, expected in (("anthropic", AnthropicBackend), (None, ProviderBackend)):
        engine = provider_engine(config, url, "m", None, (), kind)
        assert engine is not None
        backend, _, _ = engine()
        assert type(backend) is expected
