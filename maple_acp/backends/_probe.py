"""The start-up check of each configured provider: one bounded ``GET /models`` per provider,
turned into one line a user can act on (reachable with its models, or what is wrong and how to
fix it) and one small JSON object for ``maple-acp status``.

Resource handling: each probe opens its own client and closes it before returning; all
probes run at once in a nursery this module owns and end within :data:`PROBE_BOUND_S`.

Error handling: nothing propagates but cancellation. A provider that cannot be reached, refuses
the key or answers nonsense is a :class:`ProviderCheck` saying so: ``serve`` keeps running (a
laptop goes offline; the provider may be back by the first prompt).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import trio

from maple_acp._groups import single_exception
from maple_acp.backends.provider import (
    FLAG_SOURCE,
    ModelListing,
    ProviderConfig,
    ProviderEntry,
    ProviderKeys,
    RequestTimeouts,
    TlsContext,
    installed_kinds,
    split_model_id,
    where,
)

logger = logging.getLogger("maple_acp.backends")

#: A provider that has not answered ``GET /models`` in this long is reported unreachable: the
#: check must not hold up start-up logs or ``doctor`` on a dead address.
PROBE_BOUND_S: Final = 5.0
#: Model ids read from one answer: enough to tell whether the configured ones are there.
MAX_PROBED_MODELS: Final = 4096

#: The states a provider can be in.
CHECKING: Final = "checking"
REACHABLE: Final = "reachable"
UNREACHABLE: Final = "unreachable"
UNAUTHORIZED: Final = "unauthorized"
MODEL_UNKNOWN: Final = "model unknown"
FAILING: Final = "failing"
#: The provider's kind lists no models, so there is nothing to ask it at start.
NOT_CHECKED: Final = "not checked"


@attrs.frozen(kw_only=True)
class ProviderCheck:
    """What the start-up check found for one provider."""

    name: str
    #: Scheme, host and port only (never a path with a token in it, never the key).
    address: str
    state: str
    #: Models the server listed (``None`` when it did not answer with a list).
    models: int | None = None
    #: What is wrong and how to fix it; empty when nothing is.
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state in (REACHABLE, NOT_CHECKED)

    def line(self) -> str:
        """One log line: ``provider "NAME" at ADDRESS: STATE...`` (quoted: the provider of
        ``--provider-url`` is called ``provider``)."""
        text = f'provider "{self.name}" at {self.address}: {self.state}'
        if self.models is not None:
            text += f", {self.models} model{'' if self.models == 1 else 's'} listed"
        if self.detail:
            text += f" ({self.detail})"
        return text

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"name": self.name, "address": self.address, "state": self.state}
        if self.models is not None:
            shown["models"] = self.models
        if self.detail:
            shown["detail"] = self.detail
        return shown


def pending_checks(config: ProviderConfig) -> tuple[ProviderCheck, ...]:
    """What ``status`` shows before the check has answered."""
    return tuple(
        ProviderCheck(name=entry.name, address=where(entry), state=CHECKING)
        for entry in config.providers
    )


def _key_hint(config: ProviderConfig, entry: ProviderEntry) -> str:
    if entry.api_key_env is None:
        if config.source == FLAG_SOURCE:
            return "no key variable is configured: set --api-key-env NAME"
        return "no key variable is configured: set --api-key-env NAME, or api_key_env in the file"
    return f"the key in {entry.api_key_env} was refused"


def _expected_models(config: ProviderConfig, entry: ProviderEntry) -> list[str]:
    """The model ids this provider must serve: its listed ones, else the default if it is
    this provider's."""
    if entry.models is not None:
        return list(entry.models)
    try:
        provider, model = split_model_id(config.default_model)
    except ValueError:
        return []
    return [model] if provider == entry.name else []


def _not_listed(entry: ProviderEntry) -> ProviderCheck:
    return ProviderCheck(
        name=entry.name,
        address=where(entry),
        state=NOT_CHECKED,
        detail=f"the {entry.kind} engine does not list its models",
    )


async def check_provider(
    config: ProviderConfig,
    entry: ProviderEntry,
    key: str | None,
    *,
    bound_s: float = PROBE_BOUND_S,
    tls: TlsContext | None = None,
    listing: ModelListing | None = None,
) -> ProviderCheck:
    """Ask ``entry`` for its models (``GET /models``, in its kind's shape: ``listing``, by
    default its kind's own) within ``bound_s`` and say what that shows."""
    address = where(entry)
    if listing is None:
        listing = installed_kinds().get(entry.kind).listing()
    if listing is None:
        return _not_listed(entry)
    timeouts = RequestTimeouts(connect=bound_s, read=bound_s, write=bound_s, pool=bound_s)
    names: list[str] = []
    with trio.move_on_after(bound_s) as scope:
        try:
            async with listing.open_models(entry, key, timeouts, tls or TlsContext()) as models:
                async for model in models:
                    if isinstance(model, str) and model.strip():
                        names.append(model)
                    if len(names) >= MAX_PROBED_MODELS:
                        break
        except Exception as exc:
            inner = single_exception(exc)
            status = getattr(inner, "status_code", None)
            if status in (401, 403):
                return ProviderCheck(
                    name=entry.name,
                    address=address,
                    state=UNAUTHORIZED,
                    detail=f"HTTP {status}: {_key_hint(config, entry)}",
                )
            if status is not None:
                # The SDK's text may quote the key; say only the status.
                return ProviderCheck(
                    name=entry.name, address=address, state=FAILING, detail=f"HTTP {status}"
                )
            return ProviderCheck(
                name=entry.name,
                address=address,
                state=UNREACHABLE,
                detail=f"{type(inner).__name__}; is the server running at {entry.base_url}?",
            )
    if scope.cancelled_caught:
        return ProviderCheck(
            name=entry.name,
            address=address,
            state=UNREACHABLE,
            detail=f"no answer to GET /models within {bound_s:.0f} s",
        )
    listed = set(names)
    missing = [model for model in _expected_models(config, entry) if model not in listed]
    if missing and names:
        return ProviderCheck(
            name=entry.name,
            address=address,
            state=MODEL_UNKNOWN,
            models=len(names),
            detail=f"the server does not list {', '.join(missing[:3])}; check the model id",
        )
    return ProviderCheck(name=entry.name, address=address, state=REACHABLE, models=len(names))


async def check_providers(
    config: ProviderConfig,
    keys: ProviderKeys,
    listings: Mapping[str, ModelListing],
    *,
    bound_s: float = PROBE_BOUND_S,
) -> Sequence[ProviderCheck]:
    """Check every provider at once (in configuration order), each within ``bound_s``, with
    its kind's listing in ``listings`` (a kind missing there lists no models)."""
    results: list[ProviderCheck | None] = [None] * len(config.providers)
    tls = TlsContext()

    async def one(index: int, entry: ProviderEntry) -> None:
        listing = listings.get(entry.kind)
        results[index] = (
            await check_provider(
                config, entry, keys.key_for(entry.name), bound_s=bound_s, tls=tls, listing=listing
            )
            if listing is not None
            else _not_listed(entry)
        )

    async with trio.open_nursery() as nursery:
        for index, entry in enumerate(config.providers):
            nursery.start_soon(one, index, entry)
    return [result for result in results if result is not None]
