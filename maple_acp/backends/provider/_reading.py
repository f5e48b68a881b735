"""Reading a provider configuration whole: the foundation's keys (``_config``), then each
provider's kind, found in the registry (``_kinds``), and the settings that kind reads from
the rest of the provider's table. A configuration built from ``serve``'s flags is read the
same way.

No kind is imported but those the configuration names, and no SDK at all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from maple_acp.backends.provider._config import (
    FLAG_PROVIDER_NAME,
    FLAG_SOURCE,
    OPENAI_KIND,
    ProviderConfig,
    ProviderConfigError,
    ProviderEntry,
    provider_error,
    read_provider_tables,
)
from maple_acp.backends.provider._kinds import (
    EngineKind,
    EngineKinds,
    KindUnavailable,
    SettingError,
    installed_kinds,
)


def load_provider_config(
    raw: Mapping[str, Any], source: str, *, kinds: EngineKinds | None = None
) -> ProviderConfig:
    """Check the provider part of a configuration file, each provider's kind and that kind's
    settings included.

    ``raw`` is the parsed TOML table (other keys are ignored: they belong to other readers);
    ``source`` names the file in errors; ``kinds`` is the registry (the installed kinds by
    default). Raises ``ProviderConfigError``: one line naming the key, for an unknown kind the
    known ones."""
    config, extras = read_provider_tables(raw, source)
    registry = installed_kinds() if kinds is None else kinds
    providers = tuple(
        _settled(entry, extra, f"providers[{index}]", registry, source)
        for index, (entry, extra) in enumerate(zip(config.providers, extras, strict=True))
    )
    return attrs.evolve(config, providers=providers)


def kind_of(entry: ProviderEntry, registry: EngineKinds, source: str, where: str) -> EngineKind:
    """The kind serving ``entry``; ``ProviderConfigError`` at ``where.kind`` when there is
    none to be had."""
    try:
        return registry.get(entry.kind)
    except KindUnavailable as exc:
        shown = f"{entry.kind[:64]!r} " if str(exc).startswith("is not") else ""
        raise provider_error(source, f"{where}.kind", f"{shown}{exc}") from None


def _settled(
    entry: ProviderEntry,
    extra: Mapping[str, Any],
    where: str,
    registry: EngineKinds,
    source: str,
) -> ProviderEntry:
    kind = kind_of(entry, registry, source, where)
    try:
        settings = kind.settings(extra)
    except SettingError as exc:
        raise provider_error(source, f"{where}.{exc.key}", exc.what) from None
    except Exception as exc:
        # A kind is code from another package: its own failure is not the user's setting.
        raise provider_error(
            source,
            where,
            f"the {kind.display_name} engine failed to read its settings ({type(exc).__name__})",
        ) from None
    return attrs.evolve(entry, kind_settings=settings)


def provider_config_from_flags(
    base_url: str,
    model: str,
    *,
    api_key_env: str | None = None,
    context_window: int | None = None,
    system_prompt: str | None = None,
    max_rate_limit_wait: float | None = None,
    kind: str = OPENAI_KIND,
    kinds: EngineKinds | None = None,
) -> ProviderConfig:
    """The configuration of ``serve --provider-url URL --model ID [--api-key-env NAME]
    [--provider-kind KIND]``: one provider named ``provider`` offering exactly ``ID`` (clients
    see ``provider/ID``)."""
    raw: dict[str, Any] = {
        "providers": [
            {
                "name": FLAG_PROVIDER_NAME,
                "kind": kind,
                "base_url": base_url,
                "models": [model],
                **({"api_key_env": api_key_env} if api_key_env is not None else {}),
                **({"context_window": context_window} if context_window is not None else {}),
            }
        ],
        "default_model": f"{FLAG_PROVIDER_NAME}/{model}",
    }
    if system_prompt is not None:
        raw["system_prompt"] = system_prompt
    if max_rate_limit_wait is not None:
        raw["max_rate_limit_wait"] = max_rate_limit_wait
    try:
        return load_provider_config(raw, FLAG_SOURCE, kinds=kinds)
    except ProviderConfigError as exc:
        # Say which flag, not which key of a table the user never wrote.
        text = str(exc)
        for key, flag in (
            ("providers[0].base_url", "--provider-url"),
            ("providers[0].models[0]", "--model"),
            ("providers[0].api_key_env", "--api-key-env"),
            ("providers[0].context_window", "--context-window"),
            ("providers[0].kind", "--provider-kind"),
        ):
            text = text.replace(key, flag)
        raise ProviderConfigError(text) from None
