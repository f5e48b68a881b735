"""The frozen tool catalog, result sanitising and the one ``external_mcp`` tool definition.

Pure functions over JSON-ready dicts: the router feeds them what a server sent, page by page, and
they enforce every catalog and result limit without any I/O. A server's own words (tool names,
descriptions) never reach an error message; positions do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

import attrs
import orjson

from maple_acp._text import one_line
from maple_acp.mcp._errors import ExternalToolError, McpSetupError

#: The name of the single static tool the backend sees.
EXTERNAL_MCP_TOOL_NAME: Final = "external_mcp"
#: Joins a server key and a tool name into a frozen id.
TOOL_ID_SEPARATOR: Final = "__"
#: A catalog that needs more pages than this is treated as hostile (docs/limits.md).
MAX_CATALOG_PAGES: Final = 16
#: Tools one server may contribute (docs/limits.md).
MAX_TOOLS_PER_SERVER: Final = 256
#: Tools all servers of a lease may contribute together (docs/limits.md).
MAX_TOOLS_TOTAL: Final = 1024
#: One sanitised tool, serialized (docs/limits.md).
MAX_TOOL_BYTES: Final = 256 * 1024
#: The whole sanitised catalog of a lease, serialized (docs/limits.md).
MAX_CATALOG_BYTES: Final = 2 * 1024 * 1024
#: Tool ids are model-facing identifiers; providers cap function names near this.
MAX_TOOL_ID_BYTES: Final = 64
#: One sanitised call result, serialized (docs/limits.md).
MAX_RESULT_BYTES: Final = 4 * 1024 * 1024
#: Per tool in the external_mcp description: enough to choose a tool, not a payload channel.
MAX_DESCRIBED_TEXT_CHARS: Final = 1000
#: Per tool in the external_mcp description: the input schema as compact JSON.
MAX_DESCRIBED_SCHEMA_CHARS: Final = 4000
#: The whole external_mcp description; later tools are then named only through the enum.
MAX_DEFINITION_DESCRIPTION_CHARS: Final = 128_000

_TOOL_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]+")
# What is kept of a server's tool: everything else (annotations, _meta, icons, execution hints,
# fields of later protocol revisions) is dropped.
_KEPT_TOOL_FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema")
# Server-supplied decoration stripped from results, their content items and embedded resources.
_STRIPPED_FIELDS: Final = frozenset({"annotations", "_meta", "icons"})

_DESCRIPTION_HEAD: Final = (
    "Calls a tool on one of the MCP servers the client connected to this session. Set "
    '"tool" to one of the ids listed below and "arguments" to an object that matches that '
    "tool's input schema. Every call asks the user for permission first."
)


@attrs.frozen
class FrozenTool:
    """One tool of the frozen catalog, as sanitised at discovery."""

    id: str
    server_index: int
    server_key: str
    name: str
    definition: Mapping[str, Any] = attrs.field(repr=False)
    size: int

    @property
    def description(self) -> str | None:
        value = self.definition.get("description")
        return value if isinstance(value, str) else None

    @property
    def input_schema(self) -> Mapping[str, Any]:
        value = self.definition.get("inputSchema")
        return value if isinstance(value, Mapping) else {}


@attrs.frozen
class ExternalToolDefinition:
    """The static ``external_mcp`` tool as a backend receives it."""

    name: str
    description: str
    input_schema: dict[str, Any]


def sanitise_tool(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only the name, title, description and schemas of a server's tool."""
    return {field: raw[field] for field in _KEPT_TOOL_FIELDS if raw.get(field) is not None}


def serialized_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (the unit every size limit here is counted in)."""
    return len(orjson.dumps(value))


class ServerCatalog:
    """The catalog of one server being discovered, page by page (sans I/O).

    Call :meth:`add_page` with each ``tools/list`` page; it returns the cursor to request next,
    or ``None`` once the listing is complete. Any broken rule raises :class:`McpSetupError`
    naming the server by ``where`` and the offending tool by position.
    """

    def __init__(self, *, where: str, server_index: int, server_key: str) -> None:
        self._where = where
        self._index = server_index
        self._key = server_key
        self._pages = 0
        self._cursors: set[str] = set()
        self._tools: list[FrozenTool] = []
        self._names: set[str] = set()
        self._bytes = 0
        self._done = False

    def add_page(self, tools: Sequence[Mapping[str, Any]], next_cursor: str | None) -> str | None:
        if self._done:
            raise RuntimeError("catalog already complete")
        self._pages += 1
        if self._pages > MAX_CATALOG_PAGES:
            self._fail(f"tool catalog has more than {MAX_CATALOG_PAGES} pages")
        for raw in tools:
            self._add_tool(raw)
        if next_cursor is None:
            self._done = True
            return None
        if next_cursor == "" or next_cursor in self._cursors:
            self._fail("tool catalog is invalid: empty or repeated pagination cursor")
        if self._pages == MAX_CATALOG_PAGES:
            self._fail(f"tool catalog has more than {MAX_CATALOG_PAGES} pages")
        self._cursors.add(next_cursor)
        return next_cursor

    def frozen(self) -> tuple[FrozenTool, ...]:
        if not self._done:
            raise RuntimeError("catalog not complete")
        return tuple(self._tools)

    def _add_tool(self, raw: Mapping[str, Any]) -> None:
        position = len(self._tools)
        if position >= MAX_TOOLS_PER_SERVER:
            self._fail(f"tool catalog has more than {MAX_TOOLS_PER_SERVER} tools")
        name = raw.get("name")
        room = MAX_TOOL_ID_BYTES - len(self._key) - len(TOOL_ID_SEPARATOR)
        if not isinstance(name, str) or not _TOOL_ID_RE.fullmatch(name) or len(name) > room:
            self._fail(
                f"tool #{position} has a name that is not 1 to {max(room, 0)} characters of "
                "A-Z a-z 0-9 _ -, so the catalog is refused"
            )
        if name in self._names:
            self._fail(f"tool #{position} repeats the name of an earlier tool")
        if not isinstance(raw.get("inputSchema"), Mapping):
            self._fail(f"tool #{position} has no input schema object")
        definition = sanitise_tool(raw)
        size = serialized_size(definition)
        if size > MAX_TOOL_BYTES:
            self._fail(f"tool #{position} is larger than {MAX_TOOL_BYTES} bytes")
        self._bytes += size
        if self._bytes > MAX_CATALOG_BYTES:
            self._fail(f"tool catalog is larger than {MAX_CATALOG_BYTES} bytes")
        self._names.add(name)
        self._tools.append(
            FrozenTool(
                id=f"{self._key}{TOOL_ID_SEPARATOR}{name}",
                server_index=self._index,
                server_key=self._key,
                name=name,
                definition=definition,
                size=size,
            )
        )

    def _fail(self, reason: str) -> NoReturn:
        raise McpSetupError(f"{self._where}: {reason}")


def freeze_catalog(per_server: Sequence[Sequence[FrozenTool]]) -> dict[str, FrozenTool]:
    """Join the servers' catalogs in server order, enforcing the lease-wide limits and id
    uniqueness (a key containing ``__`` could otherwise alias another server's tool)."""
    catalog: dict[str, FrozenTool] = {}
    total_bytes = 0
    for tools in per_server:
        for tool in tools:
            if len(catalog) >= MAX_TOOLS_TOTAL:
                raise McpSetupError(f"MCP servers offer more than {MAX_TOOLS_TOTAL} tools in all")
            total_bytes += tool.size
            if total_bytes > MAX_CATALOG_BYTES:
                raise McpSetupError(
                    f"MCP tool catalogs are larger than {MAX_CATALOG_BYTES} bytes in all"
                )
            if tool.id in catalog:
                raise McpSetupError(
                    f"MCP server #{tool.server_index} has a tool whose id collides with a tool "
                    f"of MCP server #{catalog[tool.id].server_index}"
                )
            catalog[tool.id] = tool
    return catalog


def _strip(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in _STRIPPED_FIELDS}


def sanitise_result(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A ``CallToolResult`` reduced to content, structured content and the error flag, with
    annotations, ``_meta`` and icons removed from it and from every content item.

    Raises :class:`ExternalToolError` if the result, sanitised, is over :data:`MAX_RESULT_BYTES`.
    """
    content: list[Any] = []
    raw_content = raw.get("content")
    if isinstance(raw_content, list):
        for item in raw_content:
            if not isinstance(item, Mapping):
                continue
            clean = _strip(item)
            resource = clean.get("resource")
            if isinstance(resource, Mapping):
                clean["resource"] = _strip(resource)
            content.append(clean)
    result: dict[str, Any] = {"content": content, "isError": raw.get("isError") is True}
    if "structuredContent" in raw and raw["structuredContent"] is not None:
        result["structuredContent"] = raw["structuredContent"]
    if serialized_size(result) > MAX_RESULT_BYTES:
        raise ExternalToolError(f"the tool result is larger than {MAX_RESULT_BYTES} bytes")
    return result


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def build_tool_definition(tools: Sequence[FrozenTool]) -> ExternalToolDefinition:
    """The ``external_mcp`` definition for a frozen catalog: a flat schema whose ``tool`` enum
    lists the exact ids, and a bounded description of each tool."""
    lines = [_DESCRIPTION_HEAD, "", "Tools:"]
    used = sum(len(line) + 1 for line in lines)
    omitted = 0
    for tool in tools:
        parts = [f"- {tool.id}"]
        title = tool.definition.get("title")
        if isinstance(title, str) and title:
            parts.append(f"({one_line(title, limit=MAX_DESCRIBED_TEXT_CHARS)})")
        if tool.description:
            parts.append("— " + one_line(tool.description, limit=MAX_DESCRIBED_TEXT_CHARS))
        schema = orjson.dumps(dict(tool.input_schema), option=orjson.OPT_SORT_KEYS).decode()
        parts.append("Input schema: " + _bounded(schema, MAX_DESCRIBED_SCHEMA_CHARS))
        line = " ".join(parts)
        if omitted or used + len(line) + 1 > MAX_DEFINITION_DESCRIPTION_CHARS - 200:
            omitted += 1
            continue
        lines.append(line)
        used += len(line) + 1
    if omitted:
        lines.append(f"({omitted} more tools are not described here; their ids are in the enum.)")
    return ExternalToolDefinition(
        name=EXTERNAL_MCP_TOOL_NAME,
        description="\n".join(lines),
        input_schema={
            "type": "object",
            "additionalProperties": False,
            "required": ["tool", "arguments"],
            "properties": {
                "tool": {"type": "string", "enum": [tool.id for tool in tools]},
                "arguments": {"type": "object"},
            },
        },
    )
