"""Implementations of the runtime's backend protocol (the host injects one): the scripted
demo, and the provider layer: :func:`build_backend` over the engine kinds registered under
the ``maple_acp.engines`` entry points (the built-in ones stand on
``maple_acp.backends.provider``, as any other kind may)."""

from maple_acp.backends._build import ProviderUnavailable, build_backend, provider_policy
from maple_acp.backends._catalog import ProviderCatalog
from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.backends.provider import (
    FLAG_PROVIDER_NAME,
    ModelPrices,
    ModelSettings,
    ProviderConfig,
    ProviderConfigError,
    ProviderEntry,
    load_provider_config,
    provider_config_from_flags,
    split_model_id,
)

__all__ = [
    "FLAG_PROVIDER_NAME",
    "DemoBackend",
    "ModelPrices",
    "ModelSettings",
    "ProviderCatalog",
    "ProviderConfig",
    "ProviderConfigError",
    "ProviderEntry",
    "ProviderUnavailable",
    "build_backend",
    "demo_catalog",
    "demo_policy",
    "load_provider_config",
    "provider_config_from_flags",
    "provider_policy",
    "split_model_id",
]
