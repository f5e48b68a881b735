"""A backend's compaction through its turn: a completed one is stored where it happened, a
failed one stores nothing, and one still running when the run is cancelled ends cancelled
with nothing stored."""

from __future__ import annotations

from pathlib import Path

import trio

from maple_acp.model import ItemKind
from maple_acp.runtime import CompactionChanged, CompactionText, RunState, Turn
from maple_acp.testing.demo import demo_service


class Compacting:
    """Compacts as the prompt says: ``ok``, ``fail`` or ``hang`` (cancelled mid-way)."""

    async def run_turn(self, turn: Turn) -> None:
        compaction_id = await turn.start_compaction()
        await turn.send_compaction_text(compaction_id, "so far: ")
        await turn.send_compaction_text(compaction_id, turn.prompt)
        if turn.prompt == "hang":
            await trio.sleep_forever()
        await turn.end_compaction(
            compaction_id, error="no summary" if turn.prompt == "fail" else None
        )
        await turn.send_text("after")


async def test_a_compaction_is_stored_only_when_it_completes(tmp_path: Path, project: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    async with (
        demo_service(data, backend=Compacting()) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(service.serve_new_task, str(project))
        ended: dict[str, list[CompactionChanged]] = {}
        for prompt in ("ok", "fail", "hang"):
            run = await lease.start_run(prompt)
            events: list[object] = []
            async for event in run.events():
                events.append(event)
                if isinstance(event, CompactionText) and prompt == "hang":
                    run.cancel()
            ended[prompt] = [e for e in events if isinstance(e, CompactionChanged)]
            if prompt == "hang":
                assert (await run.wait()).state is RunState.CANCELLED
        history = await service.store.history(lease.task_id)
        await lease.release(close=True)
    assert [e.status for e in ended["ok"]] == ["in_progress", "completed"]
    assert [(e.status, e.error) for e in ended["fail"]] == [
        ("in_progress", None),
        ("failed", "no summary"),
    ]
    assert [e.status for e in ended["hang"]] == ["in_progress", "cancelled"]
    compactions = [item for item in history if item.kind is ItemKind.COMPACTION]
    assert [(c.item_id, c.text) for c in compactions] == [
        (ended["ok"][0].compaction_id, "so far: ok")
    ]
    # Where it happened: after its turn's user message, before the text that followed it.
    kinds = [item.kind for item in history if item.run_id == compactions[0].run_id]
    assert kinds == [ItemKind.USER, ItemKind.COMPACTION, ItemKind.ASSISTANT]
