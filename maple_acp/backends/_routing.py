"""One ``AgentBackend`` over several: each turn goes to the backend of its model's provider
kind (``openai`` or ``anthropic``), so one configuration may mix engines. The router offers
the commands its backends offer (``/compact``: every engine's), none of its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import trio

from maple_acp.backends.provider import ProviderConfig, split_model_id
from maple_acp.runtime import CommandInfo, PromptCapabilities, Turn, TurnFailed, TurnResult


class KindBackend(Protocol):
    """What a provider backend offers: turns and thinking levels."""

    def thought_levels(self, model_id: str | None) -> tuple[str, ...]: ...

    async def run_turn(self, turn: Turn) -> TurnResult: ...


class ProviderRouter:
    """Sends each turn, and each thinking-level question, to the backend of the model's
    provider kind.

    Error handling: a model whose provider left the configuration fails the turn as the
    backends themselves would (one line naming the model)."""

    def __init__(self, config: ProviderConfig, backends: Mapping[str, KindBackend]) -> None:
        self._config = config
        self._backends = dict(backends)

    def _backend(self, model_id: str | None) -> KindBackend | None:
        try:
            provider, _model = split_model_id(model_id or self._config.default_model)
        except ValueError:
            return None
        entry = self._config.provider(provider)
        return None if entry is None else self._backends.get(entry.kind)

    async def warm_up(self) -> None:
        """Every backend's warm-up at once (each never raises)."""
        async with trio.open_nursery() as nursery:
            for backend in self._backends.values():
                warm_up = getattr(backend, "warm_up", None)
                if warm_up is not None:
                    nursery.start_soon(warm_up)

    async def aclose(self) -> None:
        """Close every backend that holds resources (its HTTP clients)."""
        for backend in self._backends.values():
            aclose = getattr(backend, "aclose", None)
            if aclose is not None:
                await aclose()

    async def __aenter__(self) -> ProviderRouter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def accepts_images(self, model_id: str | None) -> bool:
        """Whether the model's backend says it sees images."""
        accepts = getattr(self._backend(model_id), "accepts_images", None)
        return bool(accepts(model_id)) if accepts is not None else False

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        """What the backends take, together (``accepts_images`` then says which model)."""
        image = embedded = False
        for backend in self._backends.values():
            declared = getattr(backend, "prompt_capabilities", None)
            if isinstance(declared, PromptCapabilities):
                image = image or declared.image
                embedded = embedded or declared.embedded_context
        return PromptCapabilities(image=image, embedded_context=embedded)

    def available_commands(self) -> tuple[CommandInfo, ...]:
        """The commands the backends offer, each name once."""
        found: dict[str, CommandInfo] = {}
        for backend in self._backends.values():
            offered = getattr(backend, "available_commands", None)
            for command in offered() if offered is not None else ():
                found.setdefault(command.name, command)
        return tuple(found.values())

    def thought_levels(self, model_id: str | None) -> tuple[str, ...]:
        backend = self._backend(model_id)
        return () if backend is None else backend.thought_levels(model_id)

    async def run_turn(self, turn: Turn) -> TurnResult:
        backend = self._backend(turn.model)
        if backend is None:
            model_id = turn.model or self._config.default_model
            raise TurnFailed(f"the model {model_id[:200]!r} is no longer configured")
        return await backend.run_turn(turn)
