"""Each provider is checked at start: one bounded ``GET /models`` against a real loopback
server, read as one line a user can act on (reachable, unreachable, 401 with the fix, model
unknown); a provider that never answers is unreachable after the bound (MockClock)."""

from __future__ import annotations

import socket
from typing import Any

import trio
import trio.testing
from loopback import LoopbackProvider, Reply, error_reply
from provider_support import TEST_KEY

from maple_acp.backends import build_backend, load_provider_config
from maple_acp.backends._probe import PROBE_BOUND_S, check_provider


def _config(
    base_url: str, *, key_env: str | None = None, default: str = "lab/llama3", **extra: Any
) -> Any:
    provider: dict[str, Any] = {"name": "lab", "base_url": base_url, **extra}
    if key_env is not None:
        provider["api_key_env"] = key_env
    return load_provider_config({"providers": [provider], "default_model": default}, "test.toml")


def _models(*ids: str) -> Reply:
    return Reply(body={"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})


async def _check(config: Any, env: dict[str, str] | None = None) -> Any:
    _, catalog = build_backend(config, env or {})
    (check,) = await catalog.check_providers()
    return check


async def test_a_reachable_provider_lists_its_models(provider: LoopbackProvider) -> None:
    provider.models = _models("llama3", "qwen")
    check = await _check(_config(provider.base_url, key_env="LAB_KEY"), {"LAB_KEY": TEST_KEY})
    assert (
        check.line()
        == f'provider "lab" at http://127.0.0.1:{provider.port}: reachable, 2 models listed'
    )
    assert check.as_json() == {
        "name": "lab",
        "address": f"http://127.0.0.1:{provider.port}",
        "state": "reachable",
        "models": 2,
    }
    (request,) = provider.requests
    assert (request.method, request.path) == ("GET", "/v1/models")


async def test_401_without_a_key_variable_says_to_set_one(provider: LoopbackProvider) -> None:
    provider.models = error_reply(401, "missing bearer")
    check = await _check(_config(provider.base_url))
    assert check.state == "unauthorized"
    assert "HTTP 401: no key variable is configured: set --api-key-env NAME" in check.line()


async def test_401_with_a_key_variable_names_it_never_the_key(provider: LoopbackProvider) -> None:
    provider.models = error_reply(401, f"bad key {TEST_KEY}")
    check = await _check(_config(provider.base_url, key_env="LAB_KEY"), {"LAB_KEY": TEST_KEY})
    assert check.detail == "HTTP 401: the key in LAB_KEY was refused"
    assert TEST_KEY not in check.line()


async def test_an_unknown_model_is_named(provider: LoopbackProvider) -> None:
    provider.models = _models("llama3", "qwen")
    check = await _check(_config(provider.base_url, default="lab/qwen", models=["qwen", "mistral"]))
    assert check.state == "model unknown"
    assert check.line().endswith(
        "model unknown, 2 models listed (the server does not list mistral; check the model id)"
    )


async def test_a_provider_that_is_down_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    check = await _check(_config(f"http://127.0.0.1:{port}/v1"))
    assert check.state == "unreachable"
    assert f"is the server running at http://127.0.0.1:{port}/v1?" in check.detail


async def test_a_silent_provider_is_unreachable_after_the_bound(
    provider: LoopbackProvider, autojump_clock: trio.testing.MockClock
) -> None:
    provider.models = Reply(silent=True)
    config = _config(provider.base_url)
    started = trio.current_time()
    check = await check_provider(config, config.providers[0], None)
    assert trio.current_time() - started == PROBE_BOUND_S
    assert check.state == "unreachable"
    assert check.detail == f"no answer to GET /models within {PROBE_BOUND_S:.0f} s"
