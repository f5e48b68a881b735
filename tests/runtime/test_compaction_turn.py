"""What a backend reports and reads through its turn beyond text: a compaction (stored only
when it completes; cancelled with its run) and the images of its history (a steering
follow-up turn reads them too)."""

from __future__ import annotations

from pathlib import Path

import trio

from maple_acp.model import ItemKind
from maple_acp.runtime import (
    CompactionChanged,
    CompactionText,
    Prompt,
    PromptCapabilities,
    RunState,
    Turn,
    check_image,
)
from maple_acp.testing.demo import demo_service
from maple_acp.testing.images import png


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


class SeesHistoryImages:
    """Takes images; its first turn waits for a steering message it leaves to a follow-up,
    and each turn records the bytes of every image its history names."""

    prompt_capabilities = PromptCapabilities(image=True)

    def __init__(self) -> None:
        self.steered = trio.Event()
        self.seen: list[list[bytes | None]] = []

    async def run_turn(self, turn: Turn) -> None:
        images = [image for item in turn.history for image in item.images]
        self.seen.append([await turn.image_data(image) for image in images])
        if not self.seen[1:]:
            await turn.wait_steering()


async def test_a_follow_up_turn_reads_the_images_of_its_history(
    tmp_path: Path, project: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    backend = SeesHistoryImages()
    picture = png(2, 2)
    async with (
        demo_service(data, backend=backend) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run(Prompt("look", (check_image(picture, "image/png"),)))
        await lease.steer("and then?")
        await run.wait()
        await lease.release(close=True)
    # The first turn's history is empty; the follow-up's holds the first prompt's image.
    assert backend.seen == [[], [picture]]
