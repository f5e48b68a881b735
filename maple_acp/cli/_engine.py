"""The provider engine ``serve`` runs, built from the config file's ``[providers]`` or the
``--provider-*`` flags, and checked before anything starts.

Both ``serve`` and ``doctor`` build it here, so that the two report a bad provider setting in
the same one line.
"""

from __future__ import annotations

import os
from typing import Any

import click

from maple_acp._tool_env import check_tool_env_allow, inherited_by_tools
from maple_acp.cli._errors import CliError
from maple_acp.cli._host import EngineFactory
from maple_acp.config import ConfigFile, ConfigFileError

__all__ = ["EngineFactory", "provider_engine"]


def provider_engine(
    config: ConfigFile,
    url: str | None,
    model: str | None,
    key_env: str | None,
    tool_env_allow: tuple[str, ...] = (),
    kind: str | None = None,
) -> EngineFactory | None:
    """The provider engine when one is configured (``None``: the demo engine), built now so
    that a bad section, a missing key variable or a missing extra is one line before anything
    starts.

    ``--provider-url URL --model ID`` stands for a one-provider file and replaces the file's
    providers (flags win over the file, as everywhere); the file's ``system_prompt`` and
    ``max_rate_limit_wait`` still apply.
    """
    flags_given = not (url is None and model is None and key_env is None and kind is None)
    # A file that only bounds rate-limit waits configures no provider (the demo engine runs).
    if not flags_given and not (config.providers.keys() - {"max_rate_limit_wait"}):
        return None
    if flags_given and (url is None or model is None):
        # A usage error (exit 2), like any other pair of flags used wrongly.
        raise click.UsageError(
            "--provider-url and --model go together (--api-key-env and --provider-kind are "
            "optional)"
        )
    from maple_acp.backends import (
        ProviderConfigError,
        ProviderUnavailable,
        build_backend,
        load_provider_config,
        provider_config_from_flags,
        provider_policy,
    )

    try:
        if url is not None and model is not None:
            prompt = config.providers.get("system_prompt")
            provider = provider_config_from_flags(
                url,
                model,
                api_key_env=key_env,
                system_prompt=prompt if isinstance(prompt, str) else None,
                max_rate_limit_wait=config.providers.get("max_rate_limit_wait"),
                kind=kind or "openai",
            )
        else:
            provider = load_provider_config(config.providers, f"config file {config.path}")
        _refuse_key_reaching_tools(config, url is not None, provider, tool_env_allow)
        backend, catalog = build_backend(provider, os.environ)
    except (ProviderConfigError, ProviderUnavailable) as exc:
        raise CliError(str(exc)) from None
    policy = provider_policy()
    return lambda: (backend, catalog, policy)


def _refuse_key_reaching_tools(
    config: ConfigFile, from_flags: bool, provider: Any, tool_env_allow: tuple[str, ...]
) -> None:
    """One line when a provider's key variable is one a tool child would inherit: named in
    ``tool_env_allow`` (which only the config file sets), or one of the names every child
    gets (``PATH``, ``LC_*``, ...)."""
    keys = {entry.api_key_env for entry in provider.providers if entry.api_key_env is not None}
    if tool_env_allow and config.path is not None:
        try:
            check_tool_env_allow(tool_env_allow, keys)
        except ValueError as exc:
            raise CliError(str(ConfigFileError(config.path, "tool_env_allow", str(exc)))) from None
    for index, entry in enumerate(provider.providers):
        if entry.api_key_env is not None and inherited_by_tools(entry.api_key_env):
            where = (
                "--api-key-env"
                if from_flags
                else f"config file {config.path}: providers[{index}].api_key_env"
            )
            raise CliError(
                f"{where}: every tool child gets {entry.api_key_env}; "
                "keep the API key in another variable"
            )
