"""A user's prompt as the runtime takes it: the ``Prompt`` value, what it may carry besides
text (images checked by their bytes, embedded text resources shown as text with their URI),
the one rule on how many images it carries, and what a backend declares it accepts.

Pure functions over bytes and strings, no I/O: a caller (the ACP edge, a host's own UI)
decodes what its protocol sends, hands the bytes here, and passes the ``Prompt`` it builds
from the checked values to ``SessionLease.start_run``, which hands it whole to the turn and
stores its message. Every refusal is a ``RuntimeRejection`` of kind ``INVALID_PROMPT`` with
one line saying what is wrong.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Final

import attrs

from maple_acp.model import ImageRef
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection

logger = logging.getLogger(__name__)

#: One image's decoded bytes, at most: a screenshot fits; a provider refuses much more.
MAX_IMAGE_BYTES: Final = 5 * 1024 * 1024
#: Images in one prompt, at most (providers cap the images of a request near this).
MAX_PROMPT_IMAGES: Final = 8
#: One embedded text resource's UTF-8 bytes, at most: it goes to the model whole.
MAX_EMBEDDED_TEXT_BYTES: Final = 1024 * 1024
#: A URI shown with an image or a resource, at most (characters).
MAX_URI_CHARS: Final = 2048

PNG: Final = "image/png"
JPEG: Final = "image/jpeg"
GIF: Final = "image/gif"
WEBP: Final = "image/webp"
#: The image types a prompt may carry, as their bytes identify them.
IMAGE_TYPES: Final = (PNG, JPEG, GIF, WEBP)
#: Names clients also use for these types.
_ALIASES: Final = {"image/jpg": JPEG, "image/pjpeg": JPEG, "image/x-png": PNG}
#: JPEG markers that start a frame, whose header states the dimensions.
_JPEG_FRAMES: Final = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers that stand alone (no length follows).
_JPEG_STANDALONE: Final = frozenset({0x01, *range(0xD0, 0xDA)})


@attrs.frozen(kw_only=True)
class PromptCapabilities:
    """What a backend accepts in a prompt besides text and resource links."""

    #: Images (each model says whether it sees them: ``accepts_images``).
    image: bool = False
    #: Embedded text resources (a file's content the client attached).
    embedded_context: bool = False


@attrs.frozen(kw_only=True)
class PromptImage:
    """One checked image of a prompt: its reference (as stored) and its bytes."""

    ref: ImageRef
    data: bytes = attrs.field(repr=lambda data: f"<{len(data)} bytes>")


@attrs.frozen(kw_only=True)
class EmbeddedText:
    """One embedded text resource of a prompt, and the text it became in the message."""

    uri: str
    mime_type: str | None
    text: str

    @property
    def rendered(self) -> str:
        """The resource as the visible text of the user message (the URI, then the text)."""
        return f'<resource uri="{self.uri}">\n{self.text}\n</resource>'


def _refuse(message: str) -> RuntimeRejection:
    return RuntimeRejection(RejectionKind.INVALID_PROMPT, message)


def check_image_count(count: int) -> None:
    """The one rule on a prompt's images: at most ``MAX_PROMPT_IMAGES`` of them. A caller
    that decodes images one by one asks it as each arrives, and stops at the first too many."""
    if count > MAX_PROMPT_IMAGES:
        raise _refuse(f"a prompt carries at most {MAX_PROMPT_IMAGES} images")


def _at_most_max_images(_instance: Any, _attribute: Any, images: tuple[PromptImage, ...]) -> None:
    check_image_count(len(images))


@attrs.frozen
class Prompt:
    """One user prompt, whole from the caller to the turn and the stored user message: the
    message ``text`` (each embedded resource already in it as its ``rendered`` text), the
    checked ``images`` in the order the prompt gave them, and the embedded text
    ``resources`` for a backend that shows them apart. A plain ``str`` where a ``Prompt`` is
    taken is a text-only prompt. More than ``MAX_PROMPT_IMAGES`` images is ``INVALID_PROMPT``.
    ``idempotency_key``, the client's key for the message, is stored with it (the store says
    later which message a key inserted).
    """

    text: str
    images: tuple[PromptImage, ...] = attrs.field(default=(), validator=_at_most_max_images)
    resources: tuple[EmbeddedText, ...] = ()
    idempotency_key: str | None = None

    @property
    def image_refs(self) -> tuple[ImageRef, ...]:
        """The images as the stored message references them (bytes stored once per hash)."""
        return tuple(image.ref for image in self.images)

    @property
    def image_bytes(self) -> dict[str, bytes]:
        """The images' bytes by their SHA-256 (empty without images)."""
        return {image.ref.sha256: image.data for image in self.images}


def canonical_image_type(mime_type: str) -> str:
    """``mime_type`` lowercased, parameters dropped, common aliases resolved."""
    base = mime_type.split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base)


def sniff_image(data: bytes) -> tuple[str, int | None, int | None] | None:
    """The type of ``data`` by its magic bytes and, when its header states them, its width and
    height; ``None`` if it is none of ``IMAGE_TYPES``."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) >= 24 and data[12:16] == b"IHDR":
            return PNG, int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        return PNG, None, None
    if data.startswith((b"GIF87a", b"GIF89a")):
        if len(data) >= 10:
            return GIF, int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
        return GIF, None, None
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return (WEBP, *_webp_size(data))
    if data.startswith(b"\xff\xd8\xff"):
        return (JPEG, *_jpeg_size(data))
    return None


def _webp_size(data: bytes) -> tuple[int | None, int | None]:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return width, height
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        b0, b1, b2, b3 = data[21], data[22], data[23], data[24]
        width = 1 + (((b1 & 0x3F) << 8) | b0)
        height = 1 + (((b3 & 0x0F) << 10) | (b2 << 2) | ((b1 & 0xC0) >> 6))
        return width, height
    if chunk == b"VP8X" and len(data) >= 30:
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return width, height
    return None, None


def _jpeg_size(data: bytes) -> tuple[int | None, int | None]:
    """Walk the segments to the first frame header (bounded by the data's length)."""
    index = 2
    end = len(data)
    while index + 4 <= end:
        if data[index] != 0xFF:
            return None, None
        marker = data[index + 1]
        if marker == 0xFF:
            index += 1  # fill byte
            continue
        if marker in _JPEG_STANDALONE:
            index += 2
            continue
        length = int.from_bytes(data[index + 2 : index + 4], "big")
        if length < 2:
            return None, None
        if marker in _JPEG_FRAMES:
            if index + 9 > end:
                return None, None
            height = int.from_bytes(data[index + 5 : index + 7], "big")
            width = int.from_bytes(data[index + 7 : index + 9], "big")
            return width, height
        if marker == 0xDA:  # the scan starts before any frame header: malformed
            return None, None
        index += 2 + length
    return None, None


def check_image(data: bytes, mime_type: str, *, uri: str | None = None) -> PromptImage:
    """``data`` as a prompt image: one of ``IMAGE_TYPES`` by its magic bytes, the type the
    caller declared agreeing with them, at most ``MAX_IMAGE_BYTES``."""
    if len(data) > MAX_IMAGE_BYTES:
        raise _refuse(
            f"the image is {len(data)} bytes; at most {MAX_IMAGE_BYTES} bytes are accepted"
        )
    declared = canonical_image_type(mime_type)
    if declared not in IMAGE_TYPES:
        raise _refuse(f"image type {declared[:64]!r} is not accepted; send PNG, JPEG, GIF or WebP")
    sniffed = sniff_image(data)
    if sniffed is None:
        raise _refuse("the image's bytes are not PNG, JPEG, GIF or WebP")
    actual, width, height = sniffed
    if actual != declared:
        raise _refuse(f"the image's bytes are {actual}, but its mimeType says {declared}")
    if uri is not None and len(uri) > MAX_URI_CHARS:
        raise _refuse(f"the image's uri is longer than {MAX_URI_CHARS} characters")
    ref = ImageRef(
        sha256=hashlib.sha256(data).hexdigest(),
        mime_type=actual,
        size=len(data),
        width=width,
        height=height,
        uri=uri,
    )
    return PromptImage(ref=ref, data=data)


def check_embedded_text(uri: str, text: str, mime_type: str | None = None) -> EmbeddedText:
    """An embedded text resource: a URI and at most ``MAX_EMBEDDED_TEXT_BYTES`` of text."""
    if not uri or len(uri) > MAX_URI_CHARS or not uri.isprintable():
        raise _refuse(
            f"an embedded resource needs a printable uri of 1 to {MAX_URI_CHARS} characters"
        )
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_EMBEDDED_TEXT_BYTES:
        raise _refuse(
            f"the embedded resource is {size} bytes of text; at most "
            f"{MAX_EMBEDDED_TEXT_BYTES} are accepted"
        )
    return EmbeddedText(uri=uri, mime_type=mime_type, text=text)


def describe_image(ref: ImageRef) -> str:
    """One line about an image (type, size, dimensions when known)."""
    size = f"{ref.width}x{ref.height}, " if ref.width is not None and ref.height is not None else ""
    return f"{ref.mime_type} image, {size}{ref.size} bytes"
