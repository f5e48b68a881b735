"""The provider layer's top: :func:`build_backend` makes the engine (or the router over
several) and the model catalog for a configuration, with the permission policy for their
tools. The engines are imported here only for the kinds a configuration uses."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

from maple_acp._exceptions import MapleAcpError
from maple_acp.backends._catalog import ProviderCatalog
from maple_acp.backends._routing import KindBackend, ProviderRouter
from maple_acp.backends.provider import (
    ANTHROPIC_KIND,
    FLAG_SOURCE,
    MAX_TURN_REQUESTS,
    OPENAI_KIND,
    ProviderConfig,
    ProviderConfigError,
    ProviderKeys,
    RequestTimeouts,
)
from maple_acp.runtime import AskForTools

#: What each kind's engine needs installed, and the install that brings it.
_SDK_PACKAGES = {OPENAI_KIND: ("openai", "httpx2"), ANTHROPIC_KIND: ("anthropic", "httpx2")}
_MISSING = {
    OPENAI_KIND: "the OpenAI-compatible provider needs the openai package: "
    "pip install -e '.[openai]' in a checkout of maple-acp, "
    "or pip install 'maple-acp[openai]' from a package index",
    ANTHROPIC_KIND: "the Anthropic provider needs the anthropic package: "
    "pip install -e '.[anthropic]' in a checkout of maple-acp, "
    "or pip install 'maple-acp[anthropic]' from a package index",
}


class ProviderUnavailable(MapleAcpError):
    """A provider engine cannot be used here (its optional dependency is missing)."""


def provider_policy() -> AskForTools:
    """The permission policy for the engines' tools: ask before ``shell``, ``write_file``
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
    ``kind = "anthropic"`` get the Anthropic Messages engine; a configuration mixing kinds
    gets one backend routing each turn by its model's provider.

    Raises ``ProviderUnavailable`` without the extra of a configured kind (``openai`` or
    ``anthropic``: an Anthropic-only configuration needs no ``openai`` package), and
    ``ProviderConfigError`` when a named key variable is unset or empty (naming the variable,
    never a value)."""
    kinds = {entry.kind for entry in config.providers}
    # Only whether each SDK is there: importing one takes longer than the host's whole start,
    # so a backend imports it in the background once the host serves (``warm_up``).
    for kind in sorted(kinds):
        for package in _SDK_PACKAGES[kind]:
            if importlib.util.find_spec(package) is None:
                raise ProviderUnavailable(_MISSING[kind])

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
    options: dict[str, Any] = {
        "timeouts": timeouts,
        "max_turn_requests": max_turn_requests or MAX_TURN_REQUESTS,
        **({"backoff": backoff} if backoff is not None else {}),
    }
    backends: dict[str, KindBackend] = {}
    sdk = None
    if OPENAI_KIND in kinds:
        from maple_acp.backends.openai import ProviderBackend, SdkLoader

        # One import of the SDK, in a worker thread, for the backend and the catalog alike.
        sdk = SdkLoader()
        backends[OPENAI_KIND] = ProviderBackend(config, held, sdk=sdk, **options)
    if ANTHROPIC_KIND in kinds:
        from maple_acp.backends.anthropic import AnthropicBackend

        backends[ANTHROPIC_KIND] = AnthropicBackend(config, held, **options)
    catalog = ProviderCatalog(config, held, sdk=sdk)
    if len(backends) == 1:
        (backend,) = backends.values()
        return backend, catalog
    return ProviderRouter(config, backends), catalog
