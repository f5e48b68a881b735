"""What a client's prompt blocks and MCP definitions become before they reach the runtime: a
``Prompt`` (the runtime's one shape of a prompt) and the router's definitions.

Both are checked completely before the session is touched: a bad block or server definition is
refused with ``-32602`` and nothing is admitted, created or connected.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from typing import Final, ParamSpec, TypeVar

from maple_acp.mcp import (
    AcpMcpServer,
    HttpMcpServer,
    McpServerDefinition,
    SseMcpServer,
    StdioMcpServer,
)
from maple_acp.runtime import (
    MAX_IMAGE_BYTES,
    EmbeddedText,
    Prompt,
    PromptCapabilities,
    PromptImage,
    RuntimeRejection,
    check_embedded_text,
    check_image,
    check_image_count,
)
from maple_acp.wire import (
    INVALID_PARAMS,
    AudioContent,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    McpServer,
    McpServerAcp,
    McpServerHttp,
    McpServerSse,
    ProtocolError,
    ResourceLink,
    TextContent,
    TextResourceContents,
    v2,
)

_P = ParamSpec("_P")
_T = TypeVar("_T")

#: Text blocks are joined with one blank line between them.
BLOCK_SEPARATOR: Final = "\n\n"

_REFUSED_BLOCKS: Final = {
    ImageContent: "image",
    AudioContent: "audio",
    EmbeddedResource: "embedded resource",
}


#: Base64 characters of an image, at most, before decoding is tried: the encoding of
#: ``MAX_IMAGE_BYTES`` (a larger one is refused without spending memory on it).
MAX_IMAGE_BASE64_CHARS: Final = 4 * -(-MAX_IMAGE_BYTES // 3)


def read_prompt(blocks: Sequence[ContentBlock], accepts: PromptCapabilities) -> Prompt:
    """The prompt as the runtime takes it: text blocks as they are, a resource link as visible
    text (its name and URI; it is never fetched), an embedded text resource as its URI and
    text, joined with a blank line; images (and embedded image blobs) decoded and checked.
    A steering message is read with ``PromptCapabilities()``: text and resource links only.

    Raises ``ProtocolError(-32602)`` naming the block for an empty prompt, for audio, for an
    image or an embedded resource when ``accepts`` does not take them, for a blob resource that
    is not an image, and for an image or resource ``maple_acp.runtime`` refuses (bad base64,
    a type its bytes do not bear out, too large, more images than a prompt carries: refused
    at the first one too many, before any later block is decoded).
    """
    parts: list[str] = []
    images: list[PromptImage] = []
    resources: list[EmbeddedText] = []
    for index, block in enumerate(blocks):
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ResourceLink):
            label = block.title or block.name
            parts.append(f"{label} <{block.uri}>")
        elif isinstance(block, ImageContent) and accepts.image:
            images.append(_image(index, block.data, block.mime_type, block.uri))
            _count_images(images)
        elif isinstance(block, EmbeddedResource) and accepts.embedded_context:
            resource = block.resource
            if isinstance(resource, TextResourceContents):
                embedded = _checked(index, check_embedded_text, resource.uri, resource.text)
                resources.append(embedded)
                parts.append(embedded.rendered)
            elif accepts.image and _is_image_type(resource.mime_type):
                images.append(_image(index, resource.blob, resource.mime_type or "", resource.uri))
                _count_images(images)
            else:
                raise ProtocolError(
                    INVALID_PARAMS,
                    f"prompt[{index}]: embedded blob resources are not supported "
                    + ("except images; " if accepts.image else "; ")
                    + "send text",
                )
        else:
            kind = _REFUSED_BLOCKS.get(type(block), type(block).__name__)
            raise ProtocolError(
                INVALID_PARAMS, f"prompt[{index}]: {kind} content is not supported; send text"
            )
    if not images and not any(part.strip() for part in parts):
        raise ProtocolError(INVALID_PARAMS, "prompt: expected at least one non-empty text block")
    return Prompt(BLOCK_SEPARATOR.join(parts), tuple(images), tuple(resources))


def _count_images(images: Sequence[PromptImage]) -> None:
    """Refuse the prompt at the first image too many, before any later block is decoded (the
    rule is the runtime's)."""
    try:
        check_image_count(len(images))
    except RuntimeRejection as exc:
        raise ProtocolError(INVALID_PARAMS, f"prompt: {exc.message}") from None


def _is_image_type(mime_type: str | None) -> bool:
    return mime_type is not None and mime_type.strip().lower().startswith("image/")


def _image(index: int, data: str, mime_type: str, uri: str | None) -> PromptImage:
    if len(data) > MAX_IMAGE_BASE64_CHARS:
        raise ProtocolError(
            INVALID_PARAMS,
            f"prompt[{index}]: the image is larger than {MAX_IMAGE_BYTES} bytes",
        )
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(
            INVALID_PARAMS, f"prompt[{index}]: the image's data is not valid base64"
        ) from None
    return _checked(index, check_image, decoded, mime_type, uri=uri)


def _checked(index: int, check: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    try:
        return check(*args, **kwargs)
    except RuntimeRejection as exc:
        raise ProtocolError(INVALID_PARAMS, f"prompt[{index}]: {exc.message}") from None


def mcp_definitions(
    servers: Sequence[McpServer | v2.V2McpServer],
) -> list[McpServerDefinition]:
    """The client's MCP servers (of either version) as the router's (unvalidated)
    definitions."""
    out: list[McpServerDefinition] = []
    for server in servers:
        if isinstance(server, McpServerHttp | v2.V2McpServerHttp):
            headers = tuple((h.name, h.value) for h in server.headers)
            out.append(HttpMcpServer(server.name, server.url, headers))
        elif isinstance(server, McpServerSse):
            out.append(SseMcpServer(server.name))
        elif isinstance(server, McpServerAcp):
            out.append(AcpMcpServer(server.name, server.server_id))
        else:
            out.append(StdioMcpServer(server.name))
    return out
