"""The provider backend's pure rules: configuration checks, fault lines and retry waits (in
virtual time), history to messages, and trimming a conversation to a context window."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.testing

from maple_acp._exceptions import MapleAcpError
from maple_acp.backends import (
    ProviderConfigError,
    ProviderUnavailable,
    build_backend,
    load_provider_config,
    provider_config_from_flags,
)
from maple_acp.backends.openai._conversation import (
    DROPPED_OUTPUT,
    estimate_tokens,
    fit_to_window,
    history_messages,
)
from maple_acp.backends.provider import MAX_TOOL_RESULT_CHARS
from maple_acp.backends.provider._faults import (
    MAX_RETRIES,
    ProviderFault,
    RetryPlan,
    retry_after_seconds,
    retrying,
    status_fault,
)
from maple_acp.model import ItemKind, TimelineItem, ToolState, ToolStatus

SOURCE = "/home/u/.config/maple-acp/config.toml"


def good(**overrides: Any) -> dict[str, Any]:
    provider: dict[str, Any] = {
        "name": "local",
        "base_url": "http://localhost:11434/v1",
        "models": ["qwen", "llama"],
    }
    provider.update(overrides.pop("provider", {}))
    raw: dict[str, Any] = {"providers": [provider]}
    raw.update(overrides)
    return raw


# -- configuration ---------------------------------------------------------------------------


def test_a_minimal_file_gives_the_first_listed_model_as_default() -> None:
    config = load_provider_config(good(), SOURCE)
    assert config.default_model == "local/qwen"
    assert config.providers[0].models == ("qwen", "llama")
    assert config.system_prompt is None
    assert config.source == SOURCE


def test_a_full_file_is_read_as_written() -> None:
    raw = good(default_model="hosted/vendor/model-x", system_prompt="Be terse.")
    raw["providers"].append(
        {
            "name": "hosted",
            "base_url": "https://api.example.com/v1/",
            "api_key_env": "HOSTED_KEY",
            "context_window": 128000,
        }
    )
    config = load_provider_config(raw, SOURCE)
    hosted = config.provider("hosted")
    assert hosted is not None
    assert hosted.base_url == "https://api.example.com/v1"
    assert hosted.models is None
    assert hosted.context_window == 128000
    assert config.default_model == "hosted/vendor/model-x"
    assert config.system_prompt == "Be terse."


@pytest.mark.parametrize(
    ("raw", "key", "what"),
    [
        ({}, "providers", "no [[providers]]"),
        ({"providers": "x"}, "providers", "array of tables"),
        ({"providers": []}, "providers", "at least one"),
        ({"providers": [3]}, "providers[0]", "must be a table"),
        (good(provider={"name": ""}), "providers[0].name", "is required"),
        (good(provider={"name": "a/b"}), "providers[0].name", "no '/'"),
        (good(provider={"base_url": None}), "providers[0].base_url", "is required"),
        (good(provider={"base_url": "ftp://x"}), "providers[0].base_url", "http"),
        (good(provider={"base_url": "http://u:p@h/v1"}), "providers[0].base_url", "credentials"),
        (good(provider={"base_url": "http://h:99999/"}), "providers[0].base_url", "not a valid"),
        (good(provider={"base_url": "http://h /v1"}), "providers[0].base_url", "one URL"),
        (good(provider={"api_key_env": "sk-123"}), "providers[0].api_key_env", "environment"),
        (good(provider={"models": []}), "providers[0].models", "is empty"),
        (good(provider={"models": "qwen"}), "providers[0].models", "array"),
        (good(provider={"models": ["a", "a"]}), "providers[0].models[1]", "listed twice"),
        (good(provider={"models": [" a"]}), "providers[0].models[0]", "non-blank"),
        (good(provider={"context_window": 0}), "providers[0].context_window", "positive"),
        (good(provider={"context_window": True}), "providers[0].context_window", "positive"),
        (good(provider={"temperature": 1}), "providers[0].temperature", "not a provider setting"),
        (good(default_model="qwen"), "default_model", "provider/model"),
        (good(default_model="other/qwen"), "default_model", "not configured"),
        (good(default_model="local/gpt"), "default_model", "not in the models"),
        (good(default_model=3), "default_model", "string"),
        (good(system_prompt=["x"]), "system_prompt", "string"),
        (good(provider={"models": None}), "default_model", "is required"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(
    raw: dict[str, Any], key: str, what: str
) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw, SOURCE)
    text = str(caught.value)
    assert text.startswith(f"{SOURCE}: {key}: ")
    assert what in text
    assert "\n" not in text
    assert len(text) <= 500
    assert isinstance(caught.value, MapleAcpError)


def test_duplicate_provider_names_are_refused() -> None:
    raw = good()
    raw["providers"].append(dict(raw["providers"][0]))
    with pytest.raises(ProviderConfigError, match=r"providers\[1\]\.name: 'local' is used"):
        load_provider_config(raw, SOURCE)


def test_flags_build_one_provider_and_errors_name_the_flag() -> None:
    config = provider_config_from_flags("http://127.0.0.1:8000/v1", "m", api_key_env="K")
    assert config.default_model == "provider/m"
    assert config.providers[0].api_key_env == "K"
    with pytest.raises(ProviderConfigError, match=r"^the command line: --provider-url: "):
        provider_config_from_flags("localhost:8000", "m")
    with pytest.raises(ProviderConfigError, match=r"^the command line: --api-key-env: "):
        provider_config_from_flags("http://h/v1", "m", api_key_env="not a name")


def test_an_unset_key_variable_is_named_and_no_value_is_shown() -> None:
    config = load_provider_config(good(provider={"api_key_env": "MY_KEY"}), SOURCE)
    with pytest.raises(ProviderConfigError) as caught:
        build_backend(config, {})
    assert str(caught.value) == (
        f"{SOURCE}: providers[0].api_key_env: the environment variable MY_KEY is not set"
    )
    backend, catalog = build_backend(config, {"MY_KEY": "sk-secret-value"})
    assert "sk-secret-value" not in repr(backend.__dict__)
    assert "sk-secret-value" not in repr(catalog.__dict__)


def test_a_missing_sdk_says_which_install_fixes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    config = load_provider_config(good(), SOURCE)
    for name in list(sys.modules):
        if name == "openai" or name.startswith(("openai.", "maple_acp.backends.openai")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ProviderUnavailable, match=r"pip install 'maple-acp\[openai\]'"):
        build_backend(config, {})


async def test_the_catalog_lists_configured_models_and_refuses_retired_ones() -> None:
    config = load_provider_config(good(), SOURCE)
    _, catalog = build_backend(config, {})
    assert catalog.default_model("a").id == "local/qwen"
    assert [m.id for m in await catalog.list_models("a")] == ["local/qwen", "local/llama"]


# -- faults and retries ----------------------------------------------------------------------


def test_status_lines() -> None:
    assert (
        status_fault(401, {}, None, "m").line == "the provider refused the credentials (HTTP 401)"
    )
    assert not status_fault(403, {}, None, "m").retryable
    assert status_fault(400, {}, {"code": "model_not_found"}, "m").line.startswith(
        "the provider does not know the model 'm'"
    )
    assert "context window" in status_fault(400, {}, {"code": "context_length_exceeded"}, "m").line
    assert status_fault(429, {"retry-after": "7"}, None, "m").retry_after == 7
    assert status_fault(502, {}, None, "m").retryable
    assert "redirect" in status_fault(302, {}, None, "m").line


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, 10.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-4"}, None),
        ({}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], seconds: float | None) -> None:
    now = 1445412480.0  # 07:28:00 on that day
    assert retry_after_seconds(headers, now=now) == seconds


def test_retry_plan_bounds() -> None:
    busy = ProviderFault("x", retryable=True)
    assert [RetryPlan(busy, n, 0.0).wait() for n in range(4)] == [1.0, 2.0, 4.0, None]
    assert RetryPlan(ProviderFault("x", retryable=True, retry_after=20), 0, 9.0).wait() == 20
    assert RetryPlan(ProviderFault("x", retryable=True, retry_after=20), 0, 11.0).wait() is None
    assert RetryPlan(ProviderFault("x"), 0, 0.0).wait() is None


async def test_retries_wait_as_told_in_virtual_time(mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 0
    calls: list[float] = []

    async def attempt() -> str:
        calls.append(trio.current_time())
        if len(calls) < 3:
            raise ProviderFault("busy", retryable=True, retry_after=5 if len(calls) == 1 else None)
        return "ok"

    told: list[str] = []

    async def notify(line: str) -> None:
        told.append(line)

    assert await retrying(attempt, notify=notify) == "ok"
    assert [round(b - a, 6) for a, b in itertools.pairwise(calls)] == [5.0, 2.0]
    # The user is told of each wait before it starts (a warning notice, in the backend).
    assert told == ["busy; retrying in 5 s", "busy; retrying in 2 s"]


async def test_retries_give_up_with_one_line(mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 0
    count = 0

    async def attempt() -> str:
        nonlocal count
        count += 1
        raise ProviderFault("the provider failed to answer (HTTP 500)", retryable=True)

    start = trio.current_time()
    with pytest.raises(ProviderFault) as caught:
        await retrying(attempt)
    assert count == 1 + MAX_RETRIES
    assert caught.value.line == "the provider failed to answer (HTTP 500); gave up after 3 retries"
    assert trio.current_time() - start == pytest.approx(7.0)


async def test_a_cancel_ends_a_retry_wait(mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 0
    count = 0

    async def attempt() -> str:
        nonlocal count
        count += 1
        raise ProviderFault("rate", retryable=True, retry_after=25)

    with trio.move_on_after(10):
        await retrying(attempt)
    assert count == 1
    assert trio.current_time() == pytest.approx(10.0)


# -- history and trimming --------------------------------------------------------------------


def item(kind: ItemKind, text: str = "", tool: ToolState | None = None, n: int = 0) -> TimelineItem:
    return TimelineItem(item_id=f"i{n}{text}", kind=kind, created_ms=0, text=text, tool=tool)


def test_history_becomes_messages_with_paired_tool_calls() -> None:
    shell = ToolState(
        name="shell",
        status=ToolStatus.COMPLETED,
        raw_input={"command": "ls"},
        output_text="a b",
    )
    denied = ToolState(name="my.tool", status=ToolStatus.CANCELLED, raw_input=None)
    messages = history_messages(
        [
            item(ItemKind.USER, "list"),
            item(ItemKind.THOUGHT, "hmm"),
            item(ItemKind.ASSISTANT, "Looking."),
            item(ItemKind.TOOL, tool=shell, n=1),
            item(ItemKind.TOOL, tool=denied, n=2),
            item(ItemKind.ASSISTANT, "Found a and b."),
            item(ItemKind.USER, "thanks"),
        ]
    )
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    calls = messages[1]["tool_calls"]
    assert messages[1]["content"] == "Looking."
    assert calls[0]["function"] == {"name": "shell", "arguments": '{"command":"ls"}'}
    assert calls[1]["function"]["name"] == "my_tool"
    assert messages[2] == {"role": "tool", "tool_call_id": calls[0]["id"], "content": "a b"}
    assert messages[3]["content"] == "the tool call ended cancelled"
    assert messages[4] == {"role": "assistant", "content": "Found a and b."}
    assert len({c["id"] for c in calls}) == 2


def test_long_tool_results_are_cut_for_the_model() -> None:
    tool = ToolState(name="t", status=ToolStatus.COMPLETED, output_text="x" * 100_000)
    messages = history_messages([item(ItemKind.USER, "u"), item(ItemKind.TOOL, tool=tool)])
    assert len(messages[-1]["content"]) < MAX_TOOL_RESULT_CHARS + 100


def conversation() -> list[dict[str, Any]]:
    big = "o" * 4000
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "function": {"name": "t", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": big},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "b", "function": {"name": "t", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "b", "content": big},
        {"role": "assistant", "content": "second answer"},
        {"role": "user", "content": "latest " + "q" * 400},
    ]


def test_a_conversation_that_fits_is_unchanged() -> None:
    messages = conversation()
    assert fit_to_window(messages, 100_000) == messages


def test_the_oldest_tool_outputs_go_first() -> None:
    messages = conversation()
    total = sum(estimate_tokens(m) for m in messages)
    fitted = fit_to_window(messages, total - 500)
    assert fitted[3]["content"] == DROPPED_OUTPUT
    assert fitted[7]["content"] == "o" * 4000
    assert len(fitted) == len(messages)
    # The input is not modified.
    assert messages[3]["content"] == "o" * 4000


def test_then_the_oldest_turns_go_keeping_the_system_prompt_and_latest_message() -> None:
    messages = conversation()
    fitted = fit_to_window(messages, 150)
    assert fitted[0] == {"role": "system", "content": "sys"}
    assert fitted[-1] == messages[-1]
    contents = [m.get("content") for m in fitted]
    assert "first" not in contents
    assert "first answer" not in contents
    assert "second" in contents
    # Every tool result still follows its call.
    ids = set()
    for message in fitted:
        for call in message.get("tool_calls") or ():
            ids.add(call["id"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in ids


def test_an_impossible_budget_still_keeps_the_system_prompt_and_latest_message() -> None:
    fitted = fit_to_window(conversation(), 1)
    assert [m["role"] for m in fitted] == ["system", "user"]


def test_the_turn_in_progress_is_never_split() -> None:
    messages = conversation()[:8]  # ends with a tool result of the second turn
    fitted = fit_to_window(messages, 1)
    assert [m["role"] for m in fitted] == ["system", "user", "assistant", "tool"]


async def test_the_request_carries_system_prompt_skills_latest_plan_history_and_prompt() -> None:
    from types import SimpleNamespace

    from maple_acp.backends.openai._backend import ProviderBackend
    from maple_acp.backends.provider import ProviderKeys
    from maple_acp.model import PlanEntry, PlanStatus
    from maple_acp.runtime import RunKind

    config = load_provider_config(good(system_prompt="Be exact."), SOURCE)
    backend = ProviderBackend(config, ProviderKeys({}))
    old_plan = (PlanEntry(content="old step"),)
    plan = (PlanEntry(content="step one", status=PlanStatus.COMPLETED), PlanEntry(content="two"))
    history = [
        item(ItemKind.USER, "earlier"),
        TimelineItem(item_id="p1", kind=ItemKind.PLAN, created_ms=0, plan=old_plan),
        item(ItemKind.ASSISTANT, "earlier answer"),
        TimelineItem(item_id="p2", kind=ItemKind.PLAN, created_ms=0, plan=plan),
    ]
    turn = SimpleNamespace(
        root="/project",
        skills=(SimpleNamespace(name="deploy", path="/project/.agents/skills/deploy/SKILL.md"),),
        history=history,
        prompt="now",
        kind=RunKind.PROMPT,
        planning=False,
        images=(),
        run_id="r2",
        model=None,
    )
    messages, _ = await backend._conversation(turn)  # type: ignore[arg-type]
    system = messages[0]["content"]
    assert system.startswith("Be exact.")
    assert "- deploy: /project/.agents/skills/deploy/SKILL.md" in system
    assert "- [completed] step one\n- [pending] two" in system
    assert "old step" not in system
    assert messages[1:] == [
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "now"},
    ]
