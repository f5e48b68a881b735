"""An Anthropic provider's models are asked for in the Messages API's own shape, both by the
start-up check and by model discovery: ``GET /v1/models`` through the ``anthropic`` SDK,
with its ``anthropic-version`` header and key; its outcomes and lines are the
OpenAI-compatible check's (reachable with a count, 401 naming the variable, unreachable after
the 5 s bound)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from anthropic_support import KEY_ENV, TEST_KEY
from messages_loopback import MessagesProvider, Reply, error_reply

from maple_acp.backends import build_backend, load_provider_config
from maple_acp.backends._probe import PROBE_BOUND_S, check_provider


def _config(base_url: str, *, models: list[str] | None = None) -> Any:
    provider: dict[str, Any] = {
        "name": "claude",
        "kind": "anthropic",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
    }
    if models is not None:
        provider["models"] = models
    return load_provider_config(
        {"providers": [provider], "default_model": "claude/test-model"}, "test.toml"
    )


def _models(*ids: str) -> Reply:
    """A model list as the Messages API answers it (one page)."""
    data = [
        {
            "type": "model",
            "id": model,
            "display_name": model,
            "created_at": "2026-01-01T00:00:00Z",
        }
        for model in ids
    ]
    return Reply(
        body={
            "data": data,
            "has_more": False,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
        }
    )


def _assert_asked_the_messages_way(provider: MessagesProvider) -> None:
    (request,) = provider.requests
    assert (request.method, request.path.partition("?")[0]) == ("GET", "/v1/models")
    # The key as the SDK sends it on every Messages request (its ``api_key`` goes out as a
    # Bearer token in the SDK this project pins), with the API version it speaks.
    assert request.headers["authorization"] == f"Bearer {TEST_KEY}"
    assert request.headers["anthropic-version"]


async def test_the_start_up_check_lists_models_with_the_messages_headers(
    messages_provider: MessagesProvider,
) -> None:
    messages_provider.models = _models("test-model", "other-model")
    _, catalog = build_backend(_config(messages_provider.base_url), {KEY_ENV: TEST_KEY})
    (check,) = await catalog.check_providers()
    assert check.line() == (
        f'provider "claude" at http://127.0.0.1:{messages_provider.port}: '
        "reachable, 2 models listed"
    )
    _assert_asked_the_messages_way(messages_provider)


async def test_a_refused_key_is_named_by_its_variable_never_shown(
    messages_provider: MessagesProvider,
) -> None:
    messages_provider.models = error_reply(401, f"bad key {TEST_KEY}")
    _, catalog = build_backend(_config(messages_provider.base_url), {KEY_ENV: TEST_KEY})
    (check,) = await catalog.check_providers()
    assert check.state == "unauthorized"
    assert check.detail == f"HTTP 401: the key in {KEY_ENV} was refused"
    assert TEST_KEY not in check.line()


async def test_a_silent_messages_provider_is_unreachable_after_the_bound(
    messages_provider: MessagesProvider, autojump_clock: trio.testing.MockClock
) -> None:
    messages_provider.models = Reply(silent=True)
    config = _config(messages_provider.base_url)
    # The SDK is imported ahead, as the catalog does, so that the bound is the provider's.
    from maple_acp.backends.anthropic import import_sdk

    import_sdk()
    started = trio.current_time()
    check = await check_provider(config, config.providers[0], TEST_KEY)
    assert trio.current_time() - started == PROBE_BOUND_S
    assert check.state == "unreachable"
    assert check.detail == f"no answer to GET /models within {PROBE_BOUND_S:.0f} s"


async def test_discovery_lists_the_models_of_a_provider_without_a_list(
    messages_provider: MessagesProvider,
) -> None:
    messages_provider.models = _models("test-model", "other-model")
    _, catalog = build_backend(_config(messages_provider.base_url), {KEY_ENV: TEST_KEY})
    listed = await catalog.list_models("someone")
    assert [model.id for model in listed] == ["claude/test-model", "claude/other-model"]
    _assert_asked_the_messages_way(messages_provider)
