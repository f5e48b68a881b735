"""The host's model catalog, read through one bounded, account-fenced, cached path."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import trio

from maple_acp.runtime._admission import AdmissionFence
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection

logger = logging.getLogger(__name__)

#: One total bound on a catalog listing: discovery must answer a client's request in time.
MODEL_DISCOVERY_BOUND_S = 30.0
#: How long a listing is reused before the next read refreshes it, so that creating a session
#: does not call the catalog every time.
MODEL_CACHE_TTL_S = 300.0


@attrs.frozen(kw_only=True)
class ModelInfo:
    id: str
    name: str
    description: str = ""
    #: Only chat models are offered; embedding, speech, transcription, reranking or image
    #: models are filtered out.
    chat: bool = True


class ModelCatalog(Protocol):
    """Host-supplied model catalog."""

    def default_model(self, account: str) -> ModelInfo:
        """The host's default chat model, known without a network call."""
        ...

    async def list_models(self, account: str) -> Sequence[ModelInfo]:
        """The account's current models. May be slow; the runtime bounds it and cancels it."""
        ...


@attrs.frozen(kw_only=True)
class ModelChoices:
    """The models a caller may pick: the host default first, chat models only."""

    models: tuple[ModelInfo, ...]
    default: str
    #: False when the latest refresh failed or timed out and an older list (or only the default)
    #: is offered.
    refreshed: bool

    def __contains__(self, model_id: object) -> bool:
        return any(model.id == model_id for model in self.models)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(model.id for model in self.models)


@attrs.frozen
class StaticModelCatalog:
    """A fixed catalog: ``models[0]`` is the default."""

    models: tuple[ModelInfo, ...]

    def default_model(self, account: str) -> ModelInfo:
        return self.models[0]

    async def list_models(self, account: str) -> Sequence[ModelInfo]:
        await trio.lowlevel.checkpoint()
        return self.models


def _choices(default: ModelInfo, listed: Sequence[ModelInfo], *, refreshed: bool) -> ModelChoices:
    seen = {default.id}
    models = [default]
    for model in listed:
        if model.chat and model.id not in seen:
            seen.add(model.id)
            models.append(model)
    return ModelChoices(models=tuple(models), default=default.id, refreshed=refreshed)


@attrs.define
class _Cached:
    account: str
    generation: int
    choices: ModelChoices
    at: float


class ModelCatalogCache:
    """Reads the catalog for the signed-in account with one bound, and keeps the last good
    listing per account generation."""

    def __init__(self, catalog: ModelCatalog) -> None:
        self._catalog = catalog
        self._cached: _Cached | None = None

    def cached(self, account: str, generation: int) -> ModelChoices | None:
        cached = self._cached
        if cached is None or cached.account != account or cached.generation != generation:
            return None
        return cached.choices

    def default_choices(self, account: str) -> ModelChoices:
        return _choices(self._catalog.default_model(account), (), refreshed=False)

    async def choices(
        self,
        account: str,
        generation: int,
        current_generation: Callable[[], int],
        *,
        refresh: bool,
    ) -> ModelChoices:
        cached = self._cached
        if (
            not refresh
            and cached is not None
            and cached.account == account
            and cached.generation == generation
            and trio.current_time() - cached.at < MODEL_CACHE_TTL_S
        ):
            return cached.choices
        listed: Sequence[ModelInfo] | None = None
        with trio.move_on_after(MODEL_DISCOVERY_BOUND_S):
            try:
                listed = await self._catalog.list_models(account)
            except Exception:
                logger.warning("model catalog refresh failed", exc_info=True)
        if current_generation() != generation:
            # A listing for a signed-out account must never be published to its successor.
            raise RuntimeRejection(
                RejectionKind.ACCOUNT_CHANGED, "the account changed while models were listed"
            )
        default = self._catalog.default_model(account)
        if listed is None:
            previous = self.cached(account, generation)
            if previous is not None:
                return attrs.evolve(previous, refreshed=False)
            return _choices(default, (), refreshed=False)
        choices = _choices(default, listed, refreshed=True)
        self._cached = _Cached(account, generation, choices, trio.current_time())
        return choices


class AccountModels:
    """The catalog as the signed-in account sees it: each listing is for the account of one
    generation of the fence, so a listing that ends after an account change is never
    offered to the next account."""

    def __init__(self, cache: ModelCatalogCache, fence: AdmissionFence) -> None:
        self._cache = cache
        self._fence = fence

    async def choices(self, generation: int, refresh: bool) -> ModelChoices:
        account = self._fence.account_of(generation)
        return await self._cache.choices(
            account, generation, lambda: self._fence.generation, refresh=refresh
        )

    def cached(self) -> ModelChoices:
        """The last listing for the signed-in account, or only the host default."""
        generation = self._fence.admit()
        account = self._fence.account_of(generation)
        cached = self._cache.cached(account, generation)
        return cached if cached is not None else self._cache.default_choices(account)

    def known(self, generation: int) -> ModelChoices | None:
        """The last refreshed listing for a generation's account, without waiting."""
        if not self._fence.admits(generation):
            return None
        cached = self._cache.cached(self._fence.account_of(generation), generation)
        return cached if cached is not None and cached.refreshed else None
