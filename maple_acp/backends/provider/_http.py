"""What every engine's HTTP side shares: the request bounds, the keys held in memory, the
provider's address as shown, one TLS context, and our own ``httpx2`` client under an SDK (no
ambient proxy or environment settings, no redirects, explicit timeouts). ``httpx2`` is imported
by the functions that need it, never with this module."""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs

from maple_acp._groups import single_exception
from maple_acp.backends.provider._config import ProviderEntry
from maple_acp.backends.provider._faults import (
    MALFORMED_STREAM,
    ProviderFault,
    connection_fault,
    error_code,
    status_fault,
    stream_error,
    untrusted_certificate,
)

if TYPE_CHECKING:
    import httpx2

#: Sent as the key to a server that needs none (an SDK always sends one; local servers ignore
#: it).
NO_KEY = "no-key"
#: Keep-alive connections each provider's client keeps open: one per streaming turn at once.
MAX_KEEPALIVE_CONNECTIONS = 8
#: An idle pooled connection is closed after this long (servers drop theirs around a minute).
KEEPALIVE_EXPIRY_S = 30.0


@attrs.frozen(kw_only=True)
class RequestTimeouts:
    """Bounds on each HTTP request to a provider. ``read`` is the longest silence allowed
    inside a stream: a model may think for a while before its first token."""

    connect: float = 10.0
    read: float = 120.0
    write: float = 30.0
    pool: float = 10.0

    def for_httpx(self) -> httpx2.Timeout:
        import httpx2

        return httpx2.Timeout(
            connect=self.connect, read=self.read, write=self.write, pool=self.pool
        )


class ProviderKeys:
    """The API keys, read once from the environment at start. Held only in memory; never in a
    repr, a log line or an error."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, str | None]) -> None:
        self._keys = dict(keys)

    def key_for(self, provider: str) -> str | None:
        return self._keys.get(provider)

    def values(self) -> tuple[str, ...]:
        return tuple(key for key in self._keys.values() if key)

    def __repr__(self) -> str:
        return f"ProviderKeys({len(self._keys)} providers, values hidden)"


def where(entry: ProviderEntry) -> str:
    """The provider's address as shown in errors and logs: scheme, host and port only."""
    parts = urlsplit(entry.base_url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


class TlsContext:
    """One TLS context for every client of a backend, made on first use: building one loads
    the system's certificates, which costs more CPU than a short answer."""

    __slots__ = ("_context",)

    def __init__(self) -> None:
        self._context: ssl.SSLContext | None = None

    def get(self) -> ssl.SSLContext:
        if self._context is None:
            import httpx2

            self._context = httpx2.create_ssl_context(trust_env=False)
        return self._context


def http_client(
    entry: ProviderEntry, timeouts: RequestTimeouts, tls: TlsContext | None
) -> httpx2.AsyncClient:
    """Our HTTP client for ``entry``: no ambient settings, no redirects, explicit timeouts,
    pooled keep-alive connections; certificates only for HTTPS."""
    import httpx2

    verify: ssl.SSLContext | bool = True
    if tls is not None and entry.base_url.startswith("https:"):
        verify = tls.get()
    elif not entry.base_url.startswith("https:"):
        # Plain HTTP needs no certificates: loading them costs more than a short answer.
        verify = False
    return httpx2.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        max_redirects=0,
        timeout=timeouts.for_httpx(),
        transport=httpx2.AsyncHTTPTransport(
            trust_env=False,
            verify=verify,
            limits=httpx2.Limits(
                max_connections=None,
                max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
        ),
    )


def without_ambient_headers(variable: str, omit: Any) -> dict[str, Any]:
    """Headers that cancel the ones an SDK adds from the environment variable ``variable``
    (``omit`` is that SDK's marker for "leave out"): set for some other use of the SDK (they
    may carry a credential), they must not go to the configured endpoint."""
    text = os.environ.get(variable)
    if not text:
        return {}
    names = (line.partition(":")[0].strip() for line in text.split("\n") if ":" in line)
    return {name: omit for name in names if name and name.lower() != "authorization"}


def caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc``, its causes or contexts (or a group's members) include a ``kind``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            return any(caused_by(member, kind) for member in current.exceptions)
        current = current.__cause__ or current.__context__
    return False


def sdk_fault(exc: Exception, where: str, model: str, sdk: ModuleType) -> Exception:
    """The ``ProviderFault`` an error of an SDK (``sdk``: the ``openai`` or ``anthropic``
    package, which name their errors alike) or of the transport under it means; ``where``
    names the provider. Anything else (a bug) comes back as it was."""
    import httpx2

    inner = single_exception(exc)
    if isinstance(inner, sdk.APIStatusError):
        if inner.status_code < 400:
            # An error event inside a stream that began well.
            return stream_error(error_code(inner.body))
        return status_fault(inner.status_code, inner.response.headers, inner.body, model)
    if isinstance(inner, (sdk.APITimeoutError, httpx2.TimeoutException)):
        return connection_fault(where, timed_out=True)
    if isinstance(inner, (sdk.APIConnectionError, httpx2.TransportError)):
        if caused_by(inner, ssl.SSLError):
            return untrusted_certificate(where)
        return connection_fault(where, timed_out=False)
    if isinstance(
        inner, (json.JSONDecodeError, UnicodeDecodeError, sdk.APIResponseValidationError)
    ):
        return ProviderFault(MALFORMED_STREAM)
    if isinstance(inner, sdk.APIError):
        # An error event inside the stream; its text is the provider's, so not shown.
        return stream_error()
    return exc
