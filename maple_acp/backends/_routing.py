"""One backend over several: each turn goes to the backend of its model's provider kind, so
one configuration may mix engines. The router offers the commands its backends offer
(``/compact``: every engine's), none of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio

from maple_acp.backends.provider import ProviderConfig, split_model_id
from maple_acp.runtime import (
    Backend,
    CommandInfo,
    PromptCapabilities,
    Turn,
    TurnFailed,
    TurnResult,
    warm_up_quietly,
)


class ProviderRouter(Backend):
    """Sends each turn, and each question about a model, to the backend of the model's
    provider kind.

    Error handling: a model whose provider left the configuration fails the turn as the
    backends themselves would (one line naming the model)."""

    def __init__(self, config: ProviderConfig, backends: Mapping[str, Backend]) -> None:
        self._config = config
        self._backends = dict(backends)

    def _backend(self, model_id: str | None) -> Backend | None:
        try:
            provider, _model = split_model_id(model_id or self._config.default_model)
        except ValueError:
            return None
        entry = self._config.provider(provider)
        return None if entry is None else self._backends.get(entry.kind)

    async def warm_up(self) -> None:
        """Every backend's warm-up at once; one failing leaves the others warming."""
        async with trio.open_nursery() as nursery:
            for backend in self._backends.values():
                nursery.start_soon(warm_up_quietly, backend)

    async def aclose(self) -> None:
        """Close every backend (their HTTP clients)."""
        for backend in self._backends.values():
            await backend.aclose()

    def accepts_images(self, model_id: str | None) -> bool:
        """Whether the model's backend says it sees images."""
        backend = self._backend(model_id)
        return backend is not None and backend.accepts_images(model_id)

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        """What the backends take, together (``accepts_images`` then says which model)."""
        declared = [backend.prompt_capabilities for backend in self._backends.values()]
        return PromptCapabilities(
            image=any(each.image for each in declared),
            embedded_context=any(each.embedded_context for each in declared),
        )

    def available_commands(self) -> Sequence[CommandInfo]:
        """The commands the backends offer, each name once."""
        found: dict[str, CommandInfo] = {}
        for backend in self._backends.values():
            for command in backend.available_commands():
                found.setdefault(command.name, command)
        return tuple(found.values())

    def thought_levels(self, model_id: str | None) -> Sequence[str]:
        backend = self._backend(model_id)
        return () if backend is None else backend.thought_levels(model_id)

    async def run_turn(self, turn: Turn) -> TurnResult | None:
        backend = self._backend(turn.model)
        if backend is None:
            model_id = turn.model or self._config.default_model
            raise TurnFailed(f"the model {model_id[:200]!r} is no longer configured")
        return await backend.run_turn(turn)
