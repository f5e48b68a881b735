"""Catalog, result and tool-definition rules without sockets (the sans-I/O half of the router)."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest

from maple_acp.mcp import ExternalToolError, McpSetupError
from maple_acp.mcp._catalog import (
    MAX_CATALOG_BYTES,
    MAX_DEFINITION_DESCRIPTION_CHARS,
    MAX_DESCRIBED_SCHEMA_CHARS,
    MAX_DESCRIBED_TEXT_CHARS,
    MAX_RESULT_BYTES,
    MAX_TOOL_BYTES,
    MAX_TOOLS_TOTAL,
    FrozenTool,
    ServerCatalog,
    build_tool_definition,
    freeze_catalog,
    sanitise_result,
    sanitise_tool,
)
from maple_acp.mcp._http_transport import BoundedTransport, ResponseTooLarge


def _tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


def _catalog(key: str = "srv", index: int = 0) -> ServerCatalog:
    return ServerCatalog(where=f"MCP server #{index} ({key!r})", server_index=index, server_key=key)


def _frozen(*pages: tuple[list[dict[str, Any]], str | None], key: str = "srv") -> list[FrozenTool]:
    catalog = _catalog(key)
    for tools, cursor in pages:
        catalog.add_page(tools, cursor)
    return list(catalog.frozen())


def test_pages_are_followed_and_ids_frozen() -> None:
    catalog = _catalog()
    assert catalog.add_page([_tool("a")], "c1") == "c1"
    assert catalog.add_page([_tool("b")], "c2") == "c2"
    assert catalog.add_page([_tool("c-d_E9")], None) is None
    assert [t.id for t in catalog.frozen()] == ["srv__a", "srv__b", "srv__c-d_E9"]


def test_decoration_is_stripped_from_tools() -> None:
    raw = _tool(
        "t",
        title="T",
        description="d",
        outputSchema={"type": "object"},
        annotations={"readOnlyHint": True},
        icons=[{"src": "http://x"}],
        _meta={"k": "v"},
        execution={"taskSupport": "optional"},
        somethingNew=1,
    )
    assert sanitise_tool(raw) == {
        "name": "t",
        "title": "T",
        "description": "d",
        "inputSchema": {"type": "object"},
        "outputSchema": {"type": "object"},
    }


@pytest.mark.parametrize("cursor", ["", "c1"])
def test_empty_or_repeated_cursor_is_invalid(cursor: str) -> None:
    catalog = _catalog()
    catalog.add_page([_tool("a")], "c1")
    with pytest.raises(McpSetupError, match="empty or repeated pagination cursor"):
        catalog.add_page([_tool("b")], cursor)


def test_sixteen_pages_at_most() -> None:
    catalog = _catalog()
    for page in range(15):
        catalog.add_page([_tool(f"p{page}")], f"c{page}")
    assert catalog.add_page([_tool("p15")], None) is None
    catalog = _catalog()
    for page in range(15):
        catalog.add_page([_tool(f"p{page}")], f"c{page}")
    with pytest.raises(McpSetupError, match="more than 16 pages"):
        catalog.add_page([_tool("p15")], "c15")


def test_tools_per_server() -> None:
    assert len(_frozen(([_tool(f"t{i}") for i in range(256)], None))) == 256
    with pytest.raises(McpSetupError, match="more than 256 tools"):
        _frozen(
            ([_tool(f"t{i}") for i in range(200)], "c"), ([_tool(f"u{i}") for i in range(57)], None)
        )


@pytest.mark.parametrize(
    "name", ["", "has space", "dot.name", "é", "semi;colon", "x" * 60, 5, None]
)
def test_tool_name_must_fit_an_id(name: object) -> None:
    with pytest.raises(McpSetupError, match=r"tool #1 has a name that is not 1 to 59 characters"):
        _frozen(([_tool("ok"), {"name": name, "inputSchema": {}}], None))


def test_longest_id_is_64_bytes() -> None:
    (tool,) = _frozen(([_tool("x" * 59)], None))
    assert len(tool.id.encode()) == 64


def test_duplicate_names_and_missing_schema() -> None:
    with pytest.raises(McpSetupError, match="tool #1 repeats the name"):
        _frozen(([_tool("a")], "c"), ([_tool("a")], None))
    with pytest.raises(McpSetupError, match="tool #0 has no input schema object"):
        _frozen(([{"name": "a", "inputSchema": "nope"}], None))


def test_tool_size_is_measured_after_stripping() -> None:
    room = MAX_TOOL_BYTES - len(orjson.dumps(_tool("a", description="")))
    (tool,) = _frozen(([_tool("a", description="d" * room, _meta={"pad": "p" * room})], None))
    assert tool.size == MAX_TOOL_BYTES
    with pytest.raises(McpSetupError, match="tool #0 is larger than 262144 bytes"):
        _frozen(([_tool("a", description="d" * (room + 1))], None))


def test_server_catalog_bytes() -> None:
    big = "d" * (MAX_TOOL_BYTES - 100)
    with pytest.raises(McpSetupError, match="tool catalog is larger than 2097152 bytes"):
        _frozen(([_tool(f"t{i}", description=big) for i in range(9)], None))


def test_errors_never_quote_server_text() -> None:
    with pytest.raises(McpSetupError) as info:
        _frozen(([_tool("evil name with secret-ish text")], None))
    assert "secret-ish" not in info.value.message


def test_lease_totals_and_collisions() -> None:
    per_server = [
        _frozen(([_tool(f"t{i}") for i in range(256)], None), key=f"s{k}") for k in range(4)
    ]
    assert len(freeze_catalog(per_server)) == MAX_TOOLS_TOTAL
    extra = _frozen(([_tool("one")], None), key="s4")
    with pytest.raises(McpSetupError, match="more than 1024 tools in all"):
        freeze_catalog([*per_server, extra])

    big = "d" * (MAX_TOOL_BYTES - 200)
    fat = [
        _frozen(([_tool(f"t{i}", description=big) for i in range(4)], None), key=f"f{k}")
        for k in range(3)
    ]
    assert sum(t.size for t in fat[0]) < MAX_CATALOG_BYTES
    with pytest.raises(McpSetupError, match="larger than 2097152 bytes in all"):
        freeze_catalog(fat)

    # "a__b" + "c" and "a" + "b__c" both freeze to "a__b__c".
    left = ServerCatalog(where="#0", server_index=0, server_key="a__b")
    left.add_page([_tool("c")], None)
    right = ServerCatalog(where="#1", server_index=1, server_key="a")
    right.add_page([_tool("b__c")], None)
    with pytest.raises(McpSetupError, match="MCP server #1 has a tool whose id collides"):
        freeze_catalog([left.frozen(), right.frozen()])


def test_result_is_stripped_everywhere() -> None:
    raw = {
        "content": [
            {"type": "text", "text": "t", "annotations": {"priority": 1}, "_meta": {"a": 1}},
            {"type": "image", "data": "AA==", "mimeType": "image/png", "annotations": {}},
            {
                "type": "resource_link",
                "uri": "file:///a",
                "name": "a",
                "icons": [{"src": "http://x"}],
                "_meta": {},
            },
            {
                "type": "resource",
                "resource": {"uri": "file:///b", "text": "b", "_meta": {"x": 1}},
                "annotations": {"audience": ["user"]},
            },
            "not an object",
        ],
        "structuredContent": {"_meta": "kept: this is the tool's own data"},
        "isError": True,
        "_meta": {"trace": "x"},
        "resultType": "complete",
    }
    assert sanitise_result(raw) == {
        "content": [
            {"type": "text", "text": "t"},
            {"type": "image", "data": "AA==", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///a", "name": "a"},
            {"type": "resource", "resource": {"uri": "file:///b", "text": "b"}},
        ],
        "structuredContent": {"_meta": "kept: this is the tool's own data"},
        "isError": True,
    }
    assert sanitise_result({}) == {"content": [], "isError": False}


def test_result_size_limit() -> None:
    envelope = len(orjson.dumps({"content": [{"type": "text", "text": ""}], "isError": False}))
    fits = {"content": [{"type": "text", "text": "x" * (MAX_RESULT_BYTES - envelope)}]}
    assert sanitise_result(fits)["content"][0]["text"]
    over = {"content": [{"type": "text", "text": "x" * (MAX_RESULT_BYTES - envelope + 1)}]}
    with pytest.raises(ExternalToolError, match="larger than 4194304 bytes"):
        sanitise_result(over)
    # Stripped decoration does not count.
    fits["content"][0]["_meta"] = {"pad": "p" * 1000}
    sanitise_result(fits)


def test_tool_definition_is_flat_and_bounded() -> None:
    tools = _frozen(
        (
            [
                _tool("plain", description="Line one.\nLine two.\x00", title="Plain\ntitle"),
                {
                    "name": "wide",
                    "description": "w" * (MAX_DESCRIBED_TEXT_CHARS * 3),
                    "inputSchema": {
                        "type": "object",
                        "description": "s" * (2 * MAX_DESCRIBED_SCHEMA_CHARS),
                    },
                },
            ],
            None,
        )
    )
    definition = build_tool_definition(tools)
    assert definition.name == "external_mcp"
    assert definition.input_schema == {
        "type": "object",
        "additionalProperties": False,
        "required": ["tool", "arguments"],
        "properties": {
            "tool": {"type": "string", "enum": ["srv__plain", "srv__wide"]},
            "arguments": {"type": "object"},
        },
    }
    lines = definition.description.splitlines()
    plain = next(line for line in lines if line.startswith("- srv__plain"))
    assert (
        plain == '- srv__plain (Plain title) — Line one. Line two. Input schema: {"type":"object"}'
    )
    wide = next(line for line in lines if line.startswith("- srv__wide"))
    assert len(wide) < MAX_DESCRIBED_TEXT_CHARS + MAX_DESCRIBED_SCHEMA_CHARS + 100


def test_tool_definition_description_has_a_total_bound() -> None:
    schema = {"type": "object", "description": "s" * MAX_DESCRIBED_SCHEMA_CHARS}
    per_server = [
        _frozen(
            (
                [
                    {"name": f"t{i}", "description": "d" * 900, "inputSchema": schema}
                    for i in range(256)
                ],
                None,
            ),
            key=f"s{k}",
        )
        for k in range(4)
    ]
    tools = [t for server in per_server for t in server]
    definition = build_tool_definition(tools)
    assert len(definition.description) <= MAX_DEFINITION_DESCRIPTION_CHARS
    assert definition.description.endswith("their ids are in the enum.)")
    assert len(definition.input_schema["properties"]["tool"]["enum"]) == 1024


async def test_bounded_transport_caps_every_response_body() -> None:
    bodies = {"/fits": b"x" * 10, "/over": b"x" * 11}
    inner = httpx2.MockTransport(
        lambda request: httpx2.Response(200, content=bodies[request.url.path])
    )
    async with httpx2.AsyncClient(transport=BoundedTransport(inner, limit=10)) as client:
        assert (await client.get("http://127.0.0.1/fits")).content == b"x" * 10
        with pytest.raises(ResponseTooLarge, match="larger than 10 bytes"):
            await client.get("http://127.0.0.1/over")
