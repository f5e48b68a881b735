"""What a client's prompt and MCP definitions become before they reach the runtime.

Both are checked completely before the session is touched: a bad block or server definition is
refused with ``-32602`` and nothing is admitted, created or connected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from maple_acp.mcp import HttpMcpServer, McpServerDefinition, SseMcpServer, StdioMcpServer
from maple_acp.wire import (
    INVALID_PARAMS,
    AudioContent,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    McpServer,
    McpServerHttp,
    McpServerSse,
    ProtocolError,
    ResourceLink,
    TextContent,
)

#: Text blocks are joined with one blank line between them.
BLOCK_SEPARATOR: Final = "\n\n"

_REFUSED_BLOCKS: Final = {
    ImageContent: "image",
    AudioContent: "audio",
    EmbeddedResource: "embedded resource",
}


def prompt_text(blocks: Sequence[ContentBlock]) -> str:
    """The prompt as one text: text blocks as they are, a resource link as visible text
    (its name and URI; it is never fetched), joined with a blank line.

    Raises ``ProtocolError(-32602)`` for an empty prompt and for image, audio and embedded
    resource blocks, which this agent does not accept (and does not advertise).
    """
    parts: list[str] = []
    for index, block in enumerate(blocks):
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ResourceLink):
            label = block.title or block.name
            parts.append(f"{label} <{block.uri}>")
        else:
            kind = _REFUSED_BLOCKS.get(type(block), type(block).__name__)
            raise ProtocolError(
                INVALID_PARAMS, f"prompt[{index}]: {kind} content is not supported; send text"
            )
    if not parts or not any(part.strip() for part in parts):
        raise ProtocolError(INVALID_PARAMS, "prompt: expected at least one non-empty text block")
    return BLOCK_SEPARATOR.join(parts)


def mcp_definitions(servers: Sequence[McpServer]) -> list[McpServerDefinition]:
    """The client's MCP servers as the router's (unvalidated) definitions."""
    out: list[McpServerDefinition] = []
    for server in servers:
        if isinstance(server, McpServerHttp):
            headers = tuple((h.name, h.value) for h in server.headers)
            out.append(HttpMcpServer(server.name, server.url, headers))
        elif isinstance(server, McpServerSse):
            out.append(SseMcpServer(server.name))
        else:
            out.append(StdioMcpServer(server.name))
    return out
