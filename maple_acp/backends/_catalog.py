"""The model catalog of the configured providers (:class:`ProviderCatalog`): ``provider/model``
ids read from the configuration, or discovered from each provider's model listing within the
discovery bound, in the shape of each provider's own API (its kind's ``ModelListing``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from maple_acp._groups import single_exception
from maple_acp.backends.provider import (
    ModelListing,
    ProviderConfig,
    ProviderEntry,
    ProviderKeys,
    RequestTimeouts,
    TlsContext,
    where,
)
from maple_acp.runtime import MODEL_DISCOVERY_BOUND_S, ModelInfo

if TYPE_CHECKING:
    from maple_acp.backends._probe import ProviderCheck

logger = logging.getLogger(__name__)

#: Models kept from one provider's discovery.
MAX_DISCOVERED_MODELS = 1024

#: Words in a model id that mark a model no chat request can use.
_NOT_CHAT = ("embed", "whisper", "tts", "dall-e", "moderation", "rerank", "transcribe")


def is_chat_model(model_id: str) -> bool:
    lowered = model_id.lower()
    return not any(word in lowered for word in _NOT_CHAT)


class ProviderCatalog:
    """The runtime's ``ModelCatalog`` for the configured providers: ``provider/model`` ids, the
    configured default first. A provider without a ``models`` list is asked ``GET /models``
    (bounded); a model that left the configuration is simply not listed, and the runtime
    refuses tasks locked to it."""

    def __init__(
        self,
        config: ProviderConfig,
        keys: ProviderKeys,
        *,
        timeouts: RequestTimeouts | None = None,
        listings: Mapping[str, ModelListing] | None = None,
    ) -> None:
        self._config = config
        self._keys = keys
        self._timeouts = timeouts or RequestTimeouts(read=MODEL_DISCOVERY_BOUND_S)
        self._tls = TlsContext()
        #: How each kind's providers list their models, by kind, as the kind built them with
        #: its backend (``build_backend``): one SDK import serves both. A kind missing here
        #: lists none.
        self._listings = dict(listings or {})

    def default_model(self, account: str) -> ModelInfo:
        return self._info(self._config.default_model)

    async def check_providers(self) -> Sequence[ProviderCheck]:
        """Each provider's start-up check (``GET /models``, bounded): see ``_probe``."""
        from maple_acp.backends._probe import check_providers

        # Before the checks' own bound starts: an import is not a slow provider.
        for kind in {entry.kind for entry in self._config.providers}:
            listing = self._listings.get(kind)
            if listing is not None:
                await listing.ready()
        return await check_providers(self._config, self._keys, self._listings)

    def pending_checks(self) -> Sequence[ProviderCheck]:
        from maple_acp.backends._probe import pending_checks

        return pending_checks(self._config)

    async def list_models(self, account: str) -> Sequence[ModelInfo]:
        models: list[ModelInfo] = []
        for entry in self._config.providers:
            if entry.models is not None:
                names: Sequence[str] = entry.models
            else:
                names = await self._discover(entry)
            models.extend(self._info(f"{entry.name}/{name}") for name in names)
        return models

    async def _discover(self, entry: ProviderEntry) -> list[str]:
        listing = self._listings.get(entry.kind)
        if listing is None:
            return []
        await listing.ready()
        names: list[str] = []
        with trio.move_on_after(MODEL_DISCOVERY_BOUND_S) as scope:
            try:
                async with listing.open_models(
                    entry, self._keys.key_for(entry.name), self._timeouts, self._tls
                ) as models:
                    async for model in models:
                        if isinstance(model, str) and model.strip():
                            names.append(model)
                        if len(names) >= MAX_DISCOVERED_MODELS:
                            break
            except Exception as exc:
                # The SDK's text may quote the key; say only what kind of failure it was.
                status = getattr(single_exception(exc), "status_code", None)
                logger.warning(
                    'could not list the models of provider "%s" at %s (%s%s)',
                    entry.name,
                    where(entry),
                    type(single_exception(exc)).__name__,
                    f", HTTP {status}" if status else "",
                )
                return []
        if scope.cancelled_caught:
            logger.warning('listing the models of provider "%s" timed out', entry.name)
        return names

    def _info(self, model_id: str) -> ModelInfo:
        provider, _, model = model_id.partition("/")
        return ModelInfo(
            id=model_id,
            name=model,
            description=f"{model} at {provider}",
            chat=is_chat_model(model),
        )
