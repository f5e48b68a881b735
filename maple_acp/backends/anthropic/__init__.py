"""A second real engine: Anthropic's Messages API as an ``AgentBackend`` (``kind =
"anthropic"`` on a ``[[providers]]`` table, or ``serve --provider-kind anthropic``).

Configuration (``config.toml``)::

    [[providers]]
    name = "anthropic"
    kind = "anthropic"
    base_url = "https://api.anthropic.com/v1"
    api_key_env = "ANTHROPIC_API_KEY"      # the NAME of a variable; never the key
    models = [
      { id = "claude-sonnet-4-5", reasoning = true, context_window = 200000,
        prices = { input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 } },
    ]

The configuration, tools, modes, permission rules and fault rules are the provider layer's
(``maple_acp.backends.provider``), shared with the OpenAI-compatible engine;
``maple_acp.backends.build_backend`` builds this engine for such providers (without the extra
it raises ``ProviderUnavailable`` naming :data:`INSTALL_HINT`; the ``openai`` package is not
needed). The ``anthropic`` SDK is imported by the backend's ``warm_up`` (in a worker thread,
once a host serves) or its first turn, never at start.
"""

from maple_acp.backends.anthropic._backend import THINKING_BUDGETS, AnthropicBackend
from maple_acp.backends.anthropic._client import import_sdk, open_messages_client
from maple_acp.backends.anthropic._kind import ENGINE_KIND, INSTALL_HINT

#: The package of the ``anthropic`` extra (imported in the background once a host serves).
ANTHROPIC_SDK = "anthropic"

__all__ = [
    "ANTHROPIC_SDK",
    "ENGINE_KIND",
    "INSTALL_HINT",
    "THINKING_BUDGETS",
    "AnthropicBackend",
    "import_sdk",
    "open_messages_client",
]
