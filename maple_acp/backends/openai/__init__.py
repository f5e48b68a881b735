"""A real engine: any OpenAI-compatible Chat Completions endpoint (OpenAI, OpenRouter, vLLM, the
llama.cpp server, LM Studio, Ollama's ``/v1``) as an ``AgentBackend``.

Configuration (``config.toml``)::

    default_model = "ollama/qwen2.5-coder"
    system_prompt = "..."            # optional

    [[providers]]
    name = "ollama"
    base_url = "http://localhost:11434/v1"
    # api_key_env = "OPENAI_API_KEY" # the NAME of a variable; the key never goes in the file
    # models = ["qwen2.5-coder"]     # optional: else discovered from GET /models; an entry
    #                                # may be a table: { id = "o4-mini", reasoning = true }
    #                                # (also vision, context_window, prices = { input = 2.5,
    #                                # output = 10.0, cache_read = 1.25, cache_write = 0.0 })
    # context_window = 32768         # optional: enables context usage and trimming

A host (or ``maple-acp serve``) checks it with :func:`load_provider_config` (or
:func:`provider_config_from_flags` for ``--provider-url``/``--model``), then
:func:`build_backend` reads the keys from the environment once and returns the backend and the
model catalog to hand to ``AgentService``, with :func:`provider_policy` as its permission
policy. A model marked ``reasoning = true`` offers the thinking levels ``low``, ``medium`` and
``high`` (``AgentBackend.thought_levels``); the task's chosen level goes with each request as
``reasoning_effort``. Without the extra :func:`build_backend` raises
:class:`ProviderUnavailable` saying which ``pip install`` fixes it; with it, the ``openai`` SDK
is imported only by the backend's ``warm_up`` (in a worker thread: a host starts it once it
serves) or its first turn.

The backend keeps one HTTP client per provider for its life: use it as ``async with backend:``
(or call ``await backend.aclose()``) around the runtime that uses it, so its connections close.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from maple_acp._exceptions import MapleAcpError
from maple_acp.backends.openai._config import (
    ANTHROPIC_KIND,
    FLAG_PROVIDER_NAME,
    FLAG_SOURCE,
    OPENAI_KIND,
    ModelPrices,
    ModelSettings,
    ProviderConfig,
    ProviderConfigError,
    ProviderEntry,
    load_provider_config,
    provider_config_from_flags,
    split_model_id,
)
from maple_acp.runtime import AskForTools

if TYPE_CHECKING:
    from maple_acp.backends._routing import KindBackend
    from maple_acp.backends.openai._catalog import ProviderCatalog
    from maple_acp.backends.openai._client import RequestTimeouts

__all__ = [
    "FLAG_PROVIDER_NAME",
    "INSTALL_HINT",
    "ModelPrices",
    "ModelSettings",
    "ProviderConfig",
    "ProviderConfigError",
    "ProviderEntry",
    "ProviderUnavailable",
    "build_backend",
    "load_provider_config",
    "provider_config_from_flags",
    "provider_policy",
    "split_model_id",
]

INSTALL_HINT = "pip install 'maple-acp[openai]'"
#: The packages of the ``openai`` extra.
SDK_PACKAGES = ("openai", "httpx2")


class ProviderUnavailable(MapleAcpError):
    """The provider backend cannot be used here (its optional dependency is missing)."""


def provider_policy() -> AskForTools:
    """The permission policy for this backend's tools: ask before ``shell``, ``write_file``
    and ``edit_file`` (``external_mcp`` is always asked); ``read_file`` runs without asking."""
    return AskForTools(frozenset({"shell", "write_file", "edit_file"}))


def build_backend(
    config: ProviderConfig,
    env: Mapping[str, str],
    *,
    timeouts: RequestTimeouts | None = None,
    max_turn_requests: int | None = None,
    backoff: Sequence[float] | None = None,
) -> tuple[KindBackend, ProviderCatalog]:
    """The backend and the model catalog for ``config``. Each provider's key is read from
    ``env`` (usually ``os.environ``) here, once, and kept only in memory. Providers of
    ``kind = "anthropic"`` get the Anthropic Messages backend (``maple_acp.backends.anthropic``);
    a configuration mixing kinds gets one backend routing each turn by its model's provider.

    Raises ``ProviderUnavailable`` without the ``openai`` extra (or, for an Anthropic provider,
    the ``anthropic`` extra), and ``ProviderConfigError`` when a named key variable is unset or
    empty (naming the variable, never a value)."""
    # Only whether the SDK is there: importing it takes longer than the host's whole start, so
    # the backend imports it in the background once the host serves (``warm_up``).
    for package in SDK_PACKAGES:
        if importlib.util.find_spec(package) is None:
            raise ProviderUnavailable(
                f"the OpenAI-compatible provider needs the openai package: {INSTALL_HINT}"
            )
    if any(entry.kind == ANTHROPIC_KIND for entry in config.providers):
        from maple_acp.backends.anthropic import ANTHROPIC_SDK
        from maple_acp.backends.anthropic import INSTALL_HINT as ANTHROPIC_HINT

        if importlib.util.find_spec(ANTHROPIC_SDK) is None:
            raise ProviderUnavailable(
                f"the Anthropic provider needs the anthropic package: {ANTHROPIC_HINT}"
            )
    from maple_acp.backends.openai._backend import MAX_TURN_REQUESTS, ProviderBackend
    from maple_acp.backends.openai._catalog import ProviderCatalog
    from maple_acp.backends.openai._client import ProviderKeys, SdkLoader

    keys: dict[str, str | None] = {}
    for index, entry in enumerate(config.providers):
        if entry.api_key_env is None:
            keys[entry.name] = None
            continue
        value = env.get(entry.api_key_env)
        if not value:
            key = (
                "--api-key-env"
                if config.source == FLAG_SOURCE
                else f"providers[{index}].api_key_env"
            )
            raise ProviderConfigError(
                f"{config.source}: {key}: the environment variable {entry.api_key_env} is not set"
            )
        keys[entry.name] = value
    held = ProviderKeys(keys)
    # One import of the SDK, in a worker thread, for the backend and the catalog alike.
    sdk = SdkLoader()
    options: dict[str, Any] = {
        "timeouts": timeouts,
        "max_turn_requests": max_turn_requests or MAX_TURN_REQUESTS,
        **({"backoff": backoff} if backoff is not None else {}),
    }
    kinds = {entry.kind for entry in config.providers}
    backends: dict[str, KindBackend] = {}
    if OPENAI_KIND in kinds:
        backends[OPENAI_KIND] = ProviderBackend(config, held, sdk=sdk, **options)
    if ANTHROPIC_KIND in kinds:
        from maple_acp.backends.anthropic._backend import AnthropicBackend

        backends[ANTHROPIC_KIND] = AnthropicBackend(config, held, **options)
    catalog = ProviderCatalog(config, held, sdk=sdk)
    if len(backends) == 1:
        (backend,) = backends.values()
        return backend, catalog
    from maple_acp.backends._routing import ProviderRouter

    return ProviderRouter(config, backends), catalog
