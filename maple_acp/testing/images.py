"""Small images of every accepted type, built here (no imaging library), and the prompt blocks
that carry them: for tests of image prompts, by this library and by hosts."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any


def png(width: int = 2, height: int = 3, *, seed: int = 0) -> bytes:
    """A valid RGB PNG of ``width`` x ``height`` pixels; ``seed`` changes its pixels (and so
    its hash)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    row = bytes([0]) + bytes((seed + x) % 256 for x in range(width * 3))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def jpeg(width: int = 4, height: int = 5) -> bytes:
    """The start of a baseline JPEG: JFIF header and a frame header stating the size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def gif(width: int = 6, height: int = 7) -> bytes:
    """A GIF89a header and an empty image stream, stating the size."""
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + b"\x3b"


def webp(width: int = 8, height: int = 9) -> bytes:
    """An extended WebP (``VP8X``) header stating the size."""
    body = (
        b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    )
    chunk = b"VP8X" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def image_block(data: bytes, mime_type: str = "image/png", **extra: Any) -> dict[str, Any]:
    """An ACP ``image`` content block carrying ``data``."""
    return {
        "type": "image",
        "data": base64.b64encode(data).decode("ascii"),
        "mimeType": mime_type,
        **extra,
    }


def text_resource_block(uri: str, text: str, mime_type: str | None = None) -> dict[str, Any]:
    """An ACP embedded text ``resource`` block."""
    resource: dict[str, Any] = {"uri": uri, "text": text}
    if mime_type is not None:
        resource["mimeType"] = mime_type
    return {"type": "resource", "resource": resource}
