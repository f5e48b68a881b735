"""The provider layer's top: :func:`build_backend` makes the engine (or the router over
several) and the model catalog for a configuration, with the permission policy for their
tools. Each provider's kind comes from the registry of engine kinds (``maple_acp.engines``
entry points); only the kinds a configuration names are imported, and no SDK."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence

from maple_acp._exceptions import MapleAcpError
from maple_acp.backends._catalog import ProviderCatalog
from maple_acp.backends._routing import ProviderRouter
from maple_acp.backends.provider import (
    BACKOFF_S,
    FLAG_SOURCE,
    MAX_TURN_REQUESTS,
    EngineKind,
    EngineKinds,
    EngineOptions,
    ModelListing,
    ProviderConfig,
    ProviderConfigError,
    ProviderKeys,
    RequestTimeouts,
    installed_kinds,
    kind_of,
)
from maple_acp.runtime import AskForTools, Backend, declared_backend


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
    kinds: EngineKinds | None = None,
) -> tuple[Backend, ProviderCatalog]:
    """The backend and the model catalog for ``config``. Each provider's key is read from
    ``env`` (usually ``os.environ``) here, once, and kept only in memory. Each provider's
    ``kind`` names its engine in ``kinds`` (the installed kinds by default); a configuration
    mixing kinds gets one backend routing each turn by its model's provider.

    Raises ``ProviderUnavailable`` when a configured kind's package is missing (an
    Anthropic-only configuration needs no ``openai`` package), and ``ProviderConfigError``
    for a kind that is not installed, a named key variable that is unset or empty (naming the
    variable, never a value), or a provider without ``models`` whose kind cannot list them."""
    registry = installed_kinds() if kinds is None else kinds
    used: dict[str, EngineKind] = {}
    for index, entry in enumerate(config.providers):
        used[entry.kind] = kind_of(entry, registry, config.source, f"providers[{index}]")
    # Only whether each SDK is there: importing one takes longer than the host's whole start,
    # so a backend imports it in the background once the host serves (``warm_up``).
    for _name, kind in sorted(used.items()):
        for package in kind.requires:
            if importlib.util.find_spec(package) is None:
                raise ProviderUnavailable(
                    f"the {kind.display_name} provider needs the {package} package: {kind.install}"
                )

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
    options = EngineOptions(
        timeouts=timeouts,
        max_turn_requests=max_turn_requests or MAX_TURN_REQUESTS,
        backoff=BACKOFF_S if backoff is None else tuple(backoff),
    )
    backends: dict[str, Backend] = {}
    listings: dict[str, ModelListing] = {}
    for name, kind in used.items():
        built = kind.build(config, held, options)
        backends[name] = declared_backend(built.backend)
        if built.listing is not None:
            listings[name] = built.listing
    for index, entry in enumerate(config.providers):
        if entry.models is None and entry.kind not in listings:
            raise ProviderConfigError(
                f"{config.source}: providers[{index}].models: is required: the "
                f"{used[entry.kind].display_name} engine does not list its models"
            )
    catalog = ProviderCatalog(config, held, listings=listings)
    if len(backends) == 1:
        (backend,) = backends.values()
        return backend, catalog
    return ProviderRouter(config, backends), catalog
