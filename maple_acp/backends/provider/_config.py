"""The provider configuration: ``[[providers]]``, ``default_model``, ``system_prompt`` and
``max_rate_limit_wait`` as read from ``config.toml`` (or built from ``serve --provider-url``),
checked once, into plain values. This module reads the foundation's keys; each provider's kind
and the kind's own settings are read by ``_reading``, through the registry (``_kinds``).

No SDK import here: a host may validate its configuration without the ``openai`` extra.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs

from maple_acp._exceptions import MapleAcpError
from maple_acp.config import DEFAULT_MAX_RATE_LIMIT_WAIT_S, check_rate_limit_wait

#: Names become the first part of every model id a client sees; keep them short and plain.
MAX_PROVIDER_NAME_CHARS = 64
#: A configuration is typed by hand; more than this many providers is a mistake.
MAX_PROVIDERS = 32
#: Model ids listed for one provider.
MAX_LISTED_MODELS = 1024
#: A system prompt sent with every request.
MAX_SYSTEM_PROMPT_CHARS = 64 * 1024
#: The provider name ``serve --provider-url`` uses, so that its model ids stay the same when
#: the URL changes (a task locked to ``provider/llama3`` stays loadable).
FLAG_PROVIDER_NAME = "provider"
#: The ``source`` of a configuration built from ``serve`` flags.
FLAG_SOURCE = "the command line"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The keys of a provider's table the foundation reads; the others are its kind's settings.
_KNOWN_PROVIDER_KEYS = frozenset(
    {"name", "kind", "base_url", "api_key_env", "models", "context_window"}
)
#: The built-in kinds' names (the kinds themselves are in the registry, ``_kinds``): a
#: provider without ``kind`` speaks Chat Completions.
OPENAI_KIND = "openai"
ANTHROPIC_KIND = "anthropic"
_KNOWN_MODEL_KEYS = frozenset({"id", "reasoning", "vision", "context_window", "prices"})
_KNOWN_PRICE_KEYS = ("input", "output", "cache_read", "cache_write")
#: Bound on the text of a configuration error (one line).
_MAX_ERROR_CHARS = 500


class ProviderConfigError(MapleAcpError):
    """A provider configuration that cannot be used: one line naming the file, the key and what
    is wrong. Never contains a key's value."""


@attrs.frozen(kw_only=True)
class ModelPrices:
    """What a model costs, in USD per million tokens."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0


@attrs.frozen(kw_only=True)
class ModelSettings:
    """What the configuration says about one listed model (a plain id says nothing: every
    setting has its default)."""

    #: The model's id at the provider (without the provider's name).
    id: str
    #: The model takes a reasoning effort: the backend offers low/medium/high thinking levels.
    reasoning: bool = False
    #: The model accepts images.
    vision: bool = False
    #: This model's context window in tokens, when known.
    context_window: int | None = None
    prices: ModelPrices | None = None


@attrs.frozen(kw_only=True)
class ProviderEntry:
    """One endpoint: OpenAI-compatible, or Anthropic's Messages API (``kind``)."""

    name: str
    #: The Chat Completions base URL (``.../v1``), without credentials.
    base_url: str
    #: The name of the environment variable that holds the API key (never the key itself);
    #: ``None`` for a server that needs none.
    api_key_env: str | None = None
    #: The models offered, without the provider prefix; ``None`` = discover from ``GET /models``.
    models: tuple[str, ...] | None = None
    #: The context window in tokens, when known (enables context usage and trimming).
    context_window: int | None = None
    #: The settings of each listed model, in the order of ``models``.
    model_settings: tuple[ModelSettings, ...] = ()
    #: The engine kind serving it (a name in the registry of kinds, ``_kinds``).
    kind: str = OPENAI_KIND
    #: Its kind's own settings, as the kind read them from the table's other keys.
    kind_settings: Any = None

    def settings_for(self, model: str) -> ModelSettings | None:
        """The configured settings of ``model`` (an id without the provider's name), ``None``
        for a model the configuration does not list."""
        for settings in self.model_settings:
            if settings.id == model:
                return settings
        return None


@attrs.frozen(kw_only=True)
class ProviderConfig:
    providers: tuple[ProviderEntry, ...]
    #: A ``provider/model`` id.
    default_model: str
    system_prompt: str | None = None
    #: Seconds a turn waits out a rate limit that resets past the retry bound (0: never).
    max_rate_limit_wait: float = DEFAULT_MAX_RATE_LIMIT_WAIT_S
    #: Where the configuration came from (a file path, or the command line), for errors.
    source: str = "configuration"

    def provider(self, name: str) -> ProviderEntry | None:
        for entry in self.providers:
            if entry.name == name:
                return entry
        return None


def split_model_id(model_id: str) -> tuple[str, str]:
    """``"provider/model"`` -> ``("provider", "model")``; the model part may contain ``/``."""
    provider, sep, model = model_id.partition("/")
    if not sep or not provider or not model:
        raise ValueError(f"model ids look like provider/model, not {model_id[:200]!r}")
    return provider, model


def read_provider_tables(
    raw: Mapping[str, Any], source: str
) -> tuple[ProviderConfig, tuple[Mapping[str, Any], ...]]:
    """Check the foundation's part of a configuration file: the configuration, and for each
    provider the keys of its table the foundation does not know (its kind's settings, which
    ``load_provider_config`` hands to the kind; ``kind_settings`` is ``None`` until then).

    ``raw`` is the parsed TOML table (other keys are ignored: they belong to other readers);
    ``source`` names the file in errors. Raises ``ProviderConfigError``."""

    def fail(key: str, what: str) -> ProviderConfigError:
        return provider_error(source, key, what)

    providers_raw = raw.get("providers")
    if providers_raw is None:
        raise fail("providers", "no [[providers]] table is configured")
    if not isinstance(providers_raw, Sequence) or isinstance(providers_raw, (str, bytes)):
        raise fail("providers", "must be an array of tables ([[providers]])")
    if not providers_raw:
        raise fail("providers", "must list at least one provider")
    if len(providers_raw) > MAX_PROVIDERS:
        raise fail("providers", f"at most {MAX_PROVIDERS} providers are supported")
    providers: list[ProviderEntry] = []
    extras: list[Mapping[str, Any]] = []
    for index, table in enumerate(providers_raw):
        entry, extra = _provider(table, f"providers[{index}]", fail)
        if any(other.name == entry.name for other in providers):
            raise fail(f"providers[{index}].name", f"{entry.name!r} is used by another provider")
        providers.append(entry)
        extras.append(extra)
    system_prompt = raw.get("system_prompt")
    if system_prompt is not None:
        if not isinstance(system_prompt, str):
            raise fail("system_prompt", "must be a string")
        if len(system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
            raise fail("system_prompt", f"is longer than {MAX_SYSTEM_PROMPT_CHARS} characters")
        if not system_prompt.strip():
            system_prompt = None
    default = _default_model(raw.get("default_model"), providers, fail)
    max_wait = raw.get("max_rate_limit_wait", DEFAULT_MAX_RATE_LIMIT_WAIT_S)
    try:
        max_wait = check_rate_limit_wait(max_wait)
    except ValueError as exc:
        raise fail("max_rate_limit_wait", str(exc)) from None
    config = ProviderConfig(
        providers=tuple(providers),
        default_model=default,
        system_prompt=system_prompt,
        max_rate_limit_wait=max_wait,
        source=source,
    )
    return config, tuple(extras)


def _provider(table: object, where: str, fail: Any) -> tuple[ProviderEntry, Mapping[str, Any]]:
    if not isinstance(table, Mapping):
        raise fail(where, "must be a table")
    extra = {str(key): value for key, value in table.items() if key not in _KNOWN_PROVIDER_KEYS}
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise fail(f"{where}.name", "is required (a short name such as 'ollama')")
    if len(name) > MAX_PROVIDER_NAME_CHARS or not _NAME.match(name):
        raise fail(
            f"{where}.name",
            f"must be 1-{MAX_PROVIDER_NAME_CHARS} letters, digits, '.', '_' or '-' (no '/')",
        )
    kind = table.get("kind", OPENAI_KIND)
    if not isinstance(kind, str):
        raise fail(f"{where}.kind", "must be the name of an engine kind, such as 'openai'")
    base_url = _base_url(table.get("base_url"), f"{where}.base_url", fail)
    api_key_env = table.get("api_key_env")
    if api_key_env is not None and (
        not isinstance(api_key_env, str) or not _ENV_NAME.match(api_key_env)
    ):
        raise fail(
            f"{where}.api_key_env",
            "must be the name of an environment variable (the key itself never goes in the file)",
        )
    models = table.get("models")
    listed: tuple[str, ...] | None = None
    settings: tuple[ModelSettings, ...] = ()
    if models is not None:
        if not isinstance(models, Sequence) or isinstance(models, (str, bytes)):
            raise fail(f"{where}.models", "must be an array of model names")
        if not models:
            raise fail(f"{where}.models", "is empty (leave it out to discover the models)")
        if len(models) > MAX_LISTED_MODELS:
            raise fail(f"{where}.models", f"lists more than {MAX_LISTED_MODELS} models")
        settings = tuple(
            _model(model, f"{where}.models[{index}]", fail) for index, model in enumerate(models)
        )
        seen: set[str] = set()
        for index, listed_model in enumerate(settings):
            if listed_model.id in seen:
                raise fail(f"{where}.models[{index}]", f"{listed_model.id!r} is listed twice")
            seen.add(listed_model.id)
        listed = tuple(model.id for model in settings)
    window = _positive_tokens(table.get("context_window"), f"{where}.context_window", fail)
    entry = ProviderEntry(
        name=name,
        base_url=base_url,
        api_key_env=api_key_env,
        models=listed,
        context_window=window,
        model_settings=settings,
        kind=kind,
    )
    return entry, extra


def _model(value: object, key: str, fail: Any) -> ModelSettings:
    """One ``models`` entry: a model id, or a table with ``id`` and its settings."""
    if isinstance(value, str):
        return ModelSettings(id=_model_id(value, key, fail))
    if not isinstance(value, Mapping):
        raise fail(key, "must be a model name or a table such as { id = 'NAME', reasoning = true }")
    unknown = sorted(str(name) for name in value if name not in _KNOWN_MODEL_KEYS)
    if unknown:
        raise fail(f"{key}.{unknown[0][:64]}", "is not a model setting")
    if "id" not in value:
        raise fail(f"{key}.id", "is required (the model's name at the provider)")
    flags = {}
    for flag in ("reasoning", "vision"):
        flag_value = value.get(flag, False)
        if not isinstance(flag_value, bool):
            raise fail(f"{key}.{flag}", "must be true or false")
        flags[flag] = flag_value
    return ModelSettings(
        id=_model_id(value["id"], f"{key}.id", fail),
        reasoning=flags["reasoning"],
        vision=flags["vision"],
        context_window=_positive_tokens(value.get("context_window"), f"{key}.context_window", fail),
        prices=_prices(value.get("prices"), f"{key}.prices", fail),
    )


def _model_id(value: object, key: str, fail: Any) -> str:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise fail(key, "must be a non-blank model name without surrounding spaces")
    if any(ord(char) < 32 for char in value) or len(value) > 256:
        raise fail(key, "must be one line of at most 256 characters")
    return value


def _positive_tokens(value: object, key: str, fail: Any) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise fail(key, "must be a positive number of tokens")
    return value


def _prices(value: object, key: str, fail: Any) -> ModelPrices | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise fail(key, "must be a table such as { input = 2.5, output = 10.0 }")
    unknown = sorted(str(name) for name in value if name not in _KNOWN_PRICE_KEYS)
    if unknown:
        raise fail(
            f"{key}.{unknown[0][:64]}", "is not a price (input, output, cache_read, cache_write)"
        )
    prices: dict[str, float] = {}
    for name in _KNOWN_PRICE_KEYS:
        price = value.get(name)
        if price is None:
            if name in ("input", "output"):
                raise fail(f"{key}.{name}", "is required (USD per million tokens)")
            continue
        if (
            not isinstance(price, (int, float))
            or isinstance(price, bool)
            or not math.isfinite(price)
            or price < 0
        ):
            raise fail(f"{key}.{name}", "must be a number of USD per million tokens, at least 0")
        prices[name] = float(price)
    return ModelPrices(**prices)


def _base_url(value: object, key: str, fail: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(key, "is required (for example 'http://localhost:11434/v1')")
    if any(ord(char) < 33 for char in value) or len(value) > 2048:
        raise fail(key, "must be one URL without spaces")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise fail(key, "is not a valid URL") from None
    del port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(key, "must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        # A URL is logged and shown in errors; a credential in it would leak.
        raise fail(key, "must not carry credentials; name an environment variable in api_key_env")
    if parts.fragment:
        raise fail(key, "must not have a #fragment")
    return value.rstrip("/")


def _default_model(value: object, providers: list[ProviderEntry], fail: Any) -> str:
    if value is None:
        first = providers[0]
        if first.models is None:
            raise fail(
                "default_model",
                f"is required when provider {first.name!r} lists no models (e.g. "
                f"'{first.name}/MODEL')",
            )
        return f"{first.name}/{first.models[0]}"
    if not isinstance(value, str):
        raise fail("default_model", "must be a string 'provider/model'")
    try:
        name, model = split_model_id(value)
    except ValueError:
        raise fail("default_model", "must look like 'provider/model'") from None
    entry = next((entry for entry in providers if entry.name == name), None)
    if entry is None:
        raise fail("default_model", f"names provider {name!r}, which is not configured")
    if entry.models is not None and model not in entry.models:
        raise fail("default_model", f"{model!r} is not in the models of provider {name!r}")
    return value


def provider_error(source: str, key: str, what: str) -> ProviderConfigError:
    """One line naming ``source`` and ``key``, bounded."""
    text = f"{source}: {key}: {what}".replace("\n", " ").replace("\r", " ")
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 3] + "..."
    return ProviderConfigError(text)
