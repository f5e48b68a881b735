"""One ``Prompt`` value from the caller to the turn and the stored message: the image-count
rule is the value's own, the backend's turn sees the same text, images and resources the
store keeps, and a steering message is the same value (text only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from maple_acp.model import ItemKind
from maple_acp.runtime import (
    MAX_PROMPT_IMAGES,
    Prompt,
    PromptCapabilities,
    RejectionKind,
    RuntimeRejection,
    SteeringOutcome,
    Turn,
    TurnResult,
    check_embedded_text,
    check_image,
)
from maple_acp.testing.demo import demo_service
from maple_acp.testing.images import png


def test_a_prompt_of_too_many_images_cannot_be_built() -> None:
    image = check_image(png(1, 1), "image/png")
    assert len(Prompt("ok", (image,) * MAX_PROMPT_IMAGES).images) == MAX_PROMPT_IMAGES
    with pytest.raises(RuntimeRejection) as caught:
        Prompt("too many", (image,) * (MAX_PROMPT_IMAGES + 1))
    assert caught.value.kind is RejectionKind.INVALID_PROMPT
    assert caught.value.message == f"a prompt carries at most {MAX_PROMPT_IMAGES} images"


class Records:
    """Takes images and resources; records what each turn was given."""

    prompt_capabilities = PromptCapabilities(image=True, embedded_context=True)

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[str], list[str], list[bytes | None]]] = []

    async def run_turn(self, turn: Turn) -> TurnResult:
        self.seen.append(
            (
                turn.prompt,
                [image.mime_type for image in turn.images],
                [resource.uri for resource in turn.resources],
                [await turn.image_data(image) for image in turn.images],
            )
        )
        return TurnResult()


async def test_the_turn_and_the_store_get_the_prompt_whole(tmp_path: Path, project: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    backend = Records()
    picture = png(3, 2)
    resource = check_embedded_text("file:///notes.txt", "remember this")
    prompt = Prompt(
        f"look\n\n{resource.rendered}", (check_image(picture, "image/png"),), (resource,)
    )
    async with demo_service(data, backend=backend) as service, trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        with trio.fail_after(10):
            await (await lease.start_run(prompt)).wait()
            # A str is a text-only prompt.
            await (await lease.start_run("plain")).wait()
        history = await service.store.history(lease.task_id)
        stored = await service.store.read_blob(prompt.images[0].ref.sha256)
        await lease.release(close=True)
    assert backend.seen == [
        (prompt.text, ["image/png"], ["file:///notes.txt"], [picture]),
        ("plain", [], [], []),
    ]
    users = [item for item in history if item.kind is ItemKind.USER]
    assert [(item.text, item.images) for item in users] == [
        (prompt.text, prompt.image_refs),
        ("plain", ()),
    ]
    assert stored == picture


async def test_a_steering_message_is_a_text_only_prompt(tmp_path: Path, project: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    backend = Records()
    image = check_image(png(1, 1), "image/png")
    async with demo_service(data, backend=backend) as service, trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        with trio.fail_after(10):
            with pytest.raises(RuntimeRejection) as caught:
                await lease.steer(Prompt("see this", (image,)))
            assert caught.value.kind is RejectionKind.INVALID_PROMPT
            # Refused before anything is decided: the session is idle and takes the message.
            message = Prompt("go on")
            assert await lease.steer(message) is SteeringOutcome.IDLE
            await (await lease.start_run(message)).wait()
        history = await service.store.history(lease.task_id)
        await lease.release(close=True)
    assert [item.text for item in history if item.kind is ItemKind.USER] == ["go on"]
    assert backend.seen == [("go on", [], [], [])]
