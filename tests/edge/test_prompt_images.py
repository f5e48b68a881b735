"""Images and embedded text resources in prompts, over the wire: what the backend declares is
what ``initialize`` advertises and what a prompt may carry; images are checked by their bytes,
stored once per hash and replayed on load; every bad form is ``-32602`` with nothing stored.
Every frame is checked against the schema."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from edge_harness import Harness, running_service

from maple_acp.backends.demo import DemoBackend
from maple_acp.edge import AcpServiceConfig
from maple_acp.edge._prompt import MAX_IMAGE_BASE64_CHARS, read_prompt
from maple_acp.runtime import (
    MAX_EMBEDDED_TEXT_BYTES,
    MAX_IMAGE_BYTES,
    MAX_PROMPT_IMAGES,
    PromptCapabilities,
    Turn,
)
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.images import gif, image_block, jpeg, png, text_resource_block, webp
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ContentBlock, ProtocolError, structure_params


async def refused(call: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        await call
    error = info.value
    assert error.code == -32602
    assert "\n" not in error.message
    assert len(error.message) <= 500
    return error


def blob_count(harness: Harness) -> int:
    conn = sqlite3.connect(harness.store_path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM blobs").fetchone()[0])
    finally:
        conn.close()


def user_chunks(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    return [u["content"] for u in client.updates(sid) if u["sessionUpdate"] == "user_message_chunk"]


async def test_an_image_prompt_is_described_stored_once_and_replayed_on_load(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    picture, photo = png(2, 3), jpeg(640, 480)
    async with harness.connect() as client:
        init = await client.initialize()
        assert init["agentCapabilities"]["promptCapabilities"] == {
            "image": True,
            "audio": False,
            "embeddedContext": True,
        }
        sid = (await client.new_session(str(project)))["sessionId"]
        blocks = [
            {"type": "text", "text": "look"},
            image_block(picture, uri="file:///shot.png"),
            image_block(photo, "image/jpeg"),
            # The same picture again: one more reference, not one more copy.
            image_block(picture),
        ]
        answer = await client.prompt(sid, blocks)
        assert answer["stopReason"] == "end_turn"
        assert client.text(sid) == (
            f"image 1: image/png image, 2x3, {len(picture)} bytes\n"
            f"image 2: image/jpeg image, 640x480, {len(photo)} bytes\n"
            f"image 3: image/png image, 2x3, {len(picture)} bytes"
            "look"
        )
        assert blob_count(harness) == 2
        # A second prompt with the same picture stores nothing new.
        await client.prompt(sid, [image_block(picture, "image/png")])
        assert blob_count(harness) == 2
        assert await client.close_session(sid) == {}
        client.validate(acp_schema)

    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        replayed = user_chunks(client, sid)
        assert replayed == [
            {"type": "text", "text": "look"},
            {
                "type": "image",
                "data": base64.b64encode(picture).decode(),
                "mimeType": "image/png",
                "uri": "file:///shot.png",
            },
            {"type": "image", "data": base64.b64encode(photo).decode(), "mimeType": "image/jpeg"},
            {"type": "image", "data": base64.b64encode(picture).decode(), "mimeType": "image/png"},
            {"type": "image", "data": base64.b64encode(picture).decode(), "mimeType": "image/png"},
        ]
        client.validate(acp_schema)


@pytest.mark.parametrize(
    ("data", "mime_type", "width", "height"),
    [
        (gif(6, 7), "image/gif", 6, 7),
        (webp(8, 9), "image/webp", 8, 9),
        (png(1, 1), "IMAGE/PNG", 1, 1),
    ],
)
async def test_each_accepted_type_is_known_by_its_bytes(
    harness: Harness, project: Path, data: bytes, mime_type: str, width: int, height: int
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, [image_block(data, mime_type)])
        assert f"{width}x{height}, {len(data)} bytes" in client.text(sid)


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ({"type": "image", "data": "not base64!", "mimeType": "image/png"}, "base64"),
        (image_block(png(), "image/jpeg"), "mimeType says image/jpeg"),
        (image_block(b"BM" + bytes(64), "image/bmp"), "not accepted"),
        (image_block(b"plain text, not an image"), "not PNG, JPEG, GIF or WebP"),
        ({"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}, "audio"),
        (
            {
                "type": "resource",
                "resource": {"uri": "file:///a.pdf", "blob": "AAAA", "mimeType": "application/pdf"},
            },
            "blob",
        ),
        (
            text_resource_block("file:///big.txt", "x" * (MAX_EMBEDDED_TEXT_BYTES + 1)),
            f"{MAX_EMBEDDED_TEXT_BYTES}",
        ),
        (text_resource_block("", "no uri"), "uri"),
    ],
)
async def test_bad_content_is_bad_params_and_stores_nothing(
    harness: Harness, project: Path, block: dict[str, Any], words: str, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        error = await refused(client.prompt(sid, [{"type": "text", "text": "hi"}, block]))
        assert error.message.startswith("prompt[1]: ")
        assert words in error.message
        assert await harness.runtime.store.item_count(sid) == 0
        assert blob_count(harness) == 0
        task = await harness.runtime.store.get_task(sid)
        assert task is not None
        assert task.provisional
        # The connection and the session are still usable.
        assert (await client.prompt(sid, "ok"))["stopReason"] == "end_turn"
        client.validate(acp_schema)


async def test_more_images_than_a_prompt_carries_are_refused(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        blocks = [image_block(png(seed=n)) for n in range(MAX_PROMPT_IMAGES + 1)]
        error = await refused(client.prompt(sid, blocks))
        assert f"at most {MAX_PROMPT_IMAGES} images" in error.message
        assert blob_count(harness) == 0
        await client.prompt(sid, blocks[:MAX_PROMPT_IMAGES])
        assert blob_count(harness) == MAX_PROMPT_IMAGES


async def test_an_embedded_text_resource_is_shown_with_its_uri_stored_and_replayed(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    code = "/hang\nprint('not a script line')\n"
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        blocks = [{"type": "text", "text": "explain"}, text_resource_block("file:///a.py", code)]
        # The resource's text is described, never run as the demo's script (no /hang).
        assert (await client.prompt(sid, blocks))["stopReason"] == "end_turn"
        assert client.text(sid) == f"resource file:///a.py: {len(code)} bytes of textexplain"
        await client.close_session(sid)
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        [replayed] = user_chunks(client, sid)
        assert replayed == {
            "type": "text",
            "text": f'explain\n\n<resource uri="file:///a.py">\n{code}\n</resource>',
        }
        client.validate(acp_schema)


async def test_an_image_too_large_for_the_outbound_budget_is_replayed_as_a_line(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    # A picture with 20 KB of trailing bytes: its line needs more credit than the budget.
    big = png(300, 200) + bytes(range(256)) * 80
    small = png(1, 1)
    config = AcpServiceConfig(max_outbound_bytes=16 * 1024)
    async with running_service(tmp_path, config=config) as harness:
        async with harness.connect(initialize=True) as client:
            sid = (await client.new_session(str(project)))["sessionId"]
            await client.prompt(sid, [image_block(big), image_block(small)])
            await client.close_session(sid)
        async with harness.connect(initialize=True) as client:
            await client.load_session(sid, str(project))
            replayed = user_chunks(client, sid)
            assert replayed == [
                {
                    "type": "text",
                    "text": f"[image/png image, 300x200, {len(big)} bytes: too large to replay]",
                },
                {
                    "type": "image",
                    "data": base64.b64encode(small).decode(),
                    "mimeType": "image/png",
                },
            ]
            client.validate(acp_schema)


class TextOnlyBackend:
    """A backend that declares nothing beyond text."""

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text(turn.prompt)


@pytest.mark.parametrize(
    "block",
    [image_block(png()), text_resource_block("file:///a.txt", "a")],
)
async def test_a_backend_that_declares_nothing_keeps_refusing(
    tmp_path: Path, project: Path, block: dict[str, Any]
) -> None:
    async with (
        running_service(tmp_path, backend=TextOnlyBackend()) as harness,
        harness.connect() as client,
    ):
        init = await client.initialize()
        caps = init["agentCapabilities"]["promptCapabilities"]
        assert caps == {"image": False, "audio": False, "embeddedContext": False}
        sid = (await client.new_session(str(project)))["sessionId"]
        error = await refused(client.prompt(sid, [{"type": "text", "text": "hi"}, block]))
        assert "not supported" in error.message
        assert await harness.runtime.store.item_count(sid) == 0


class LargeModelSees(DemoBackend):
    """The demo, where only ``demo-echo-large`` sees images."""

    def accepts_images(self, model_id: str | None) -> bool:
        return model_id == "demo-echo-large"


async def test_an_image_for_a_model_that_cannot_see_is_refused_naming_the_model(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with (
        running_service(tmp_path, backend=LargeModelSees()) as harness,
        harness.connect(initialize=True) as client,
    ):
        sid = (await client.new_session(str(project)))["sessionId"]
        error = await refused(
            client.prompt(sid, [{"type": "text", "text": "look"}, image_block(png())])
        )
        assert "demo-echo does not accept images" in error.message
        assert await harness.runtime.store.item_count(sid) == 0
        assert blob_count(harness) == 0
        await client.call(
            "session/set_config_option",
            {"sessionId": sid, "configId": "model", "value": "demo-echo-large"},
        )
        assert (await client.prompt(sid, [{"type": "text", "text": "look"}, image_block(png())]))[
            "stopReason"
        ] == ("end_turn")
        assert blob_count(harness) == 1
        client.validate(acp_schema)


@pytest.mark.parametrize(
    "data",
    [
        # Decodes to one byte more than the bound.
        base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(MAX_IMAGE_BYTES - 7)).decode(),
        # Longer than any image within the bound could encode to: refused undecoded.
        "A" * (MAX_IMAGE_BASE64_CHARS + 4),
    ],
)
def test_an_image_over_the_size_bound_is_refused(data: str) -> None:
    # A test client cannot send a frame this large (its own outbound budget is 4 MiB); a real
    # client can, within the 10 MiB frame bound, so the check is exercised on the blocks.
    block = structure_params({"type": "image", "data": data, "mimeType": "image/png"}, ContentBlock)
    with pytest.raises(ProtocolError) as info:
        read_prompt([block], PromptCapabilities(image=True))
    assert info.value.code == -32602
    assert f"{MAX_IMAGE_BYTES} bytes" in info.value.message
