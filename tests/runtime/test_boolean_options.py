"""A backend's boolean options in the runtime: what a backend may declare (a malformed list
offers none), each task's values (stored, else the default), and a refused change stores
nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from maple_acp.runtime import (
    MAX_BOOLEAN_OPTIONS,
    AgentService,
    BooleanOption,
    RejectionKind,
    RuntimeRejection,
    SessionLease,
)
from maple_acp.runtime._options import checked_boolean_options, option_values
from maple_acp.testing.demo import run_prompt

BRIEF = BooleanOption(id="brief", name="Brief", description="Answer in one line")
LOUD = BooleanOption(id="loud", name="Loud", default=True)


@pytest.mark.parametrize(
    "declared",
    [
        [BRIEF, BRIEF],
        [BooleanOption(id="", name="Empty id")],
        [BooleanOption(id="has space", name="Spaced")],
        [BooleanOption(id="x" * 65, name="Long id")],
        [BooleanOption(id="ok", name="two\nlines")],
        [BooleanOption(id="ok", name="   ")],
        [BooleanOption(id="ok", name="Ok", default=1)],  # type: ignore[arg-type]
        [BRIEF, "brief"],
        [BooleanOption(id=f"o{n}", name="O") for n in range(MAX_BOOLEAN_OPTIONS + 1)],
    ],
)
def test_a_malformed_declaration_offers_no_option(
    declared: list[object], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="maple_acp.runtime")
    assert checked_boolean_options(declared) == ()
    assert any("malformed boolean options" in r.getMessage() for r in caplog.records)


def test_a_task_has_what_it_set_else_the_default() -> None:
    assert checked_boolean_options([BRIEF, LOUD]) == (BRIEF, LOUD)
    assert option_values((BRIEF, LOUD), ()) == {"brief": False, "loud": True}
    stored = (("brief", True), ("gone", True), ("loud", False))
    assert option_values((BRIEF, LOUD), stored) == {"brief": True, "loud": False}


async def test_a_refused_change_stores_nothing(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(str(project), task_status=task_status)
        )
        assert [option.id for option in lease.boolean_options] == ["brief"]
        for option_id, value in (("nope", True), ("brief", "true"), ("brief", 1)):
            with pytest.raises(RuntimeRejection) as caught:
                await lease.set_boolean_option(option_id, value)  # type: ignore[arg-type]
            assert caught.value.kind is RejectionKind.INVALID_OPTION
        stored = await service.store.get_task(lease.task_id)
        assert stored is not None
        assert stored.boolean_options == ()
        assert await lease.set_boolean_option("brief", True) is True
        stored = await service.store.get_task(lease.task_id)
        assert stored is not None
        assert stored.boolean_options == (("brief", True),)
        assert lease.option_values == {"brief": True}
        # A fork of the prompted task starts with its options.
        await run_prompt(lease, "hello")
        await lease.release(close=True)
        fork: SessionLease = await nursery.start(
            lambda task_status: service.fork_task(
                lease.task_id, cwd=str(project), task_status=task_status
            )
        )
        assert fork.option_values == {"brief": True}
        await fork.release(close=True)
