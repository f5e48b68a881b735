"""The backend protocol declared whole: a ``Backend`` subclass gets every optional member's
default and overrides what it has; a backend written against the old structural protocol
keeps its own members through ``declared_backend`` and gets the defaults for the rest; and
the runtime reads both the same way."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from maple_acp.runtime import (
    Backend,
    CommandInfo,
    PromptCapabilities,
    RunState,
    TextChunk,
    Turn,
    declared_backend,
)
from maple_acp.runtime._backend import (
    backend_accepts_images,
    backend_commands,
    backend_prompt_capabilities,
    backend_thought_levels,
)
from maple_acp.testing.demo import demo_service, run_prompt


class Plain(Backend):
    """Writes only its turn."""

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text(f"plain: {turn.prompt}")


class Declaring(Backend):
    """Overrides every optional member, the capabilities as a class attribute."""

    prompt_capabilities = PromptCapabilities(image=True, embedded_context=True)

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text("declared")

    def available_commands(self) -> Sequence[CommandInfo]:
        return (CommandInfo(name="go", description="Go"),)

    def thought_levels(self, model_id: str | None) -> Sequence[str]:
        return ("low", "high") if model_id == "thinker" else ()

    def accepts_images(self, model_id: str | None) -> bool:
        return model_id == "eyes"

    async def warm_up(self) -> None:
        self.calls.append("warm_up")

    async def aclose(self) -> None:
        self.calls.append("aclose")


class OldStyle:
    """A backend of the protocol before ``Backend``: optional members by their structure."""

    prompt_capabilities = PromptCapabilities(image=True)

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text("old")

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return (CommandInfo(name="note", description="Note"),)

    async def warm_up(self) -> None:
        self.calls.append("warm_up")

    async def __aenter__(self) -> OldStyle:
        self.calls.append("enter")
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.calls.append("exit")


class Bare:
    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text("bare")


async def test_a_backend_subclass_has_every_default() -> None:
    plain = Plain()
    assert declared_backend(plain) is plain
    assert tuple(plain.available_commands()) == ()
    assert tuple(plain.thought_levels("m")) == ()
    assert plain.prompt_capabilities == PromptCapabilities()
    assert not plain.accepts_images(None)
    await plain.warm_up()
    async with plain as entered:
        assert entered is plain
    assert backend_commands(plain) == ()
    assert backend_thought_levels(plain, "m") == ()
    assert backend_prompt_capabilities(plain) == PromptCapabilities()
    assert not backend_accepts_images(plain, None)


async def test_a_backend_subclass_overrides_what_it_has() -> None:
    declaring = Declaring()
    assert [c.name for c in backend_commands(declaring)] == ["go"]
    assert backend_thought_levels(declaring, "thinker") == ("low", "high")
    assert backend_thought_levels(declaring, "plain") == ()
    assert backend_prompt_capabilities(declaring).embedded_context
    assert backend_accepts_images(declaring, "eyes")
    assert not backend_accepts_images(declaring, "blind")
    async with declaring:
        await declaring.warm_up()
    assert declaring.calls == ["warm_up", "aclose"]


async def test_an_old_style_backend_keeps_its_members_and_gets_the_rest() -> None:
    old = OldStyle()
    seen = declared_backend(old)
    assert isinstance(seen, Backend)
    assert [c.name for c in backend_commands(old)] == ["note"]
    assert backend_thought_levels(old, "m") == ()
    assert backend_prompt_capabilities(old) == PromptCapabilities(image=True)
    # No accepts_images of its own: its capabilities say.
    assert backend_accepts_images(old, "any")
    async with seen:
        await seen.warm_up()
    assert old.calls == ["enter", "warm_up", "exit"]

    bare = declared_backend(Bare())
    assert tuple(bare.available_commands()) == ()
    assert bare.prompt_capabilities == PromptCapabilities()
    async with bare:
        await bare.warm_up()
    await bare.aclose()


async def test_the_runtime_runs_turns_of_both_kinds(tmp_path: Path) -> None:
    for backend, answer in ((Plain(), "plain: hi"), (OldStyle(), "old"), (Bare(), "bare")):
        async with demo_service(str(tmp_path), backend=backend) as service:
            assert service.prompt_capabilities == backend_prompt_capabilities(backend)
            async with trio.open_nursery() as nursery:
                lease = await nursery.start(service.serve_new_task, str(tmp_path))
                events, outcome = await run_prompt(lease, "hi")
                assert outcome.state is RunState.COMPLETED
                assert [e.text for e in events if isinstance(e, TextChunk)] == [answer]
                await lease.release(close=True)
