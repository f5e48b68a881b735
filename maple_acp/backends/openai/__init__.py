"""The OpenAI-compatible engine: any Chat Completions endpoint (OpenAI, OpenRouter, vLLM, the
llama.cpp server, LM Studio, Ollama's ``/v1``) as an ``AgentBackend``, on the provider layer's
foundation (``maple_acp.backends.provider``).

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

A host builds it with ``maple_acp.backends.build_backend``. A model marked ``reasoning = true``
offers the thinking levels ``low``, ``medium`` and ``high``; the task's chosen level goes with
each request as ``reasoning_effort``. The ``openai`` SDK is imported only by the backend's
``warm_up`` (in a worker thread: a host starts it once it serves) or its first turn.

The backend keeps one HTTP client per provider for its life: use it as ``async with backend:``
(or call ``await backend.aclose()``) around the runtime that uses it, so its connections close.
"""

from maple_acp.backends.openai._backend import REASONING_EFFORTS, ProviderBackend
from maple_acp.backends.openai._client import SdkLoader, open_provider_client
from maple_acp.backends.openai._kind import ENGINE_KIND, INSTALL_HINT

__all__ = [
    "ENGINE_KIND",
    "INSTALL_HINT",
    "REASONING_EFFORTS",
    "ProviderBackend",
    "SdkLoader",
    "open_provider_client",
]
