"""Fuzz target: client-supplied MCP server definitions through ``validate_servers``.

The first byte picks a shape: arbitrary JSON turned into definitions (as the edge would build
them from ``mcpServers``), or the raw bytes as one URL, one header name or one header value. The
only acceptable failure is ``McpDefinitionError`` with a one-line bounded message that repeats
no header value and no URL; an accepted definition must satisfy every rule independently
re-checked here.

Run ``python fuzz/fuzz_mcp_defs.py -atheris_runs=N``; tests import :func:`fuzz_one` directly.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx2
import orjson

from maple_acp.mcp import (
    MAX_HEADER_BYTES_PER_SERVER,
    MAX_HEADER_VALUE_BYTES,
    MAX_NAME_CHARS,
    MAX_SERVER_ID_CHARS,
    MAX_SERVERS,
    RESERVED_HEADER_NAMES,
    RESERVED_HEADER_PREFIXES,
    AcpMcpServer,
    HttpMcpServer,
    McpDefinitionError,
    SseMcpServer,
    StdioMcpServer,
    ValidatedServer,
    normalise_key,
    validate_servers,
)

#: Shorter values could occur in the fixed wording of a message by chance.
_MIN_CHECKED_SECRET = 8
#: A value that is a piece of the refusals' own wording (a URL that is just "localhost") is
#: not leaked by being there.
_FIXED_WORDING = "URL must be plain http:// to localhost or a loopback IP address"
_MAX_MESSAGE_CHARS = 500


def _headers(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(value.items())
    if isinstance(value, list):
        return tuple(tuple(pair) if isinstance(pair, list) else pair for pair in value)
    return value


def _definition(value: Any) -> object:
    if not isinstance(value, dict):
        return value
    kind = value.get("type", "http")
    # Deliberately untyped: the fuzzer hands the checks whatever JSON produced.
    name: Any = value.get("name")
    url: Any = value.get("url")
    if kind == "stdio":
        return StdioMcpServer(name)
    if kind == "sse":
        return SseMcpServer(name)
    if kind == "http":
        return HttpMcpServer(name, url, _headers(value.get("headers", [])))
    if kind == "acp":
        return AcpMcpServer(name, value.get("serverId"))
    return value


def _inputs(data: bytes) -> tuple[list[object], frozenset[str]]:
    mode, body = data[0] % 4, data[1:]
    text = body.decode("utf-8", "surrogateescape" if mode else "replace")
    if mode == 1:
        return [HttpMcpServer("fuzz", text)], frozenset()
    if mode == 2:
        return [HttpMcpServer("fuzz", "http://127.0.0.1/", ((text, "v"),))], frozenset()
    if mode == 3:
        return [HttpMcpServer("fuzz", "http://127.0.0.1/", (("X-Key", text),))], frozenset()
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return [HttpMcpServer(text, text, ((text, text),))], frozenset({text})
    reserved: frozenset[str] = frozenset()
    if isinstance(parsed, dict):
        keys = parsed.get("reserved")
        if isinstance(keys, list):
            reserved = frozenset(k for k in keys if isinstance(k, str))
        parsed = parsed.get("servers", parsed)
    items = parsed if isinstance(parsed, list) else [parsed]
    return [_definition(item) for item in items], reserved


def _secrets(items: list[object]) -> list[str]:
    """URLs, header values and client-side server ids a refusal must not repeat (unless a
    server name, which a refusal may show, already contains them)."""
    names = [
        item.name
        for item in items
        if isinstance(item, HttpMcpServer | StdioMcpServer | SseMcpServer | AcpMcpServer)
        and isinstance(item.name, str)
    ]
    shown = " ".join(names + [normalise_key(name) for name in names])
    secrets: list[str] = []
    for item in items:
        if isinstance(item, AcpMcpServer):
            candidates: list[object] = [item.server_id]
        elif isinstance(item, HttpMcpServer):
            candidates = [item.url]
        else:
            continue
        if isinstance(item, HttpMcpServer) and isinstance(item.headers, tuple | list):
            candidates.extend(
                pair[1]
                for pair in item.headers
                if isinstance(pair, tuple | list) and len(pair) == 2
            )
        secrets.extend(
            value
            for value in candidates
            if isinstance(value, str)
            and len(value) >= _MIN_CHECKED_SECRET
            and value not in shown
            and value not in _FIXED_WORDING
        )
    return secrets


def _check_accepted(server: ValidatedServer) -> None:
    assert 1 <= len(server.name) <= MAX_NAME_CHARS
    assert server.key
    assert all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in server.key)
    if server.server_id is not None:
        assert server.server_id.strip()
        assert len(server.server_id) <= MAX_SERVER_ID_CHARS
        assert not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in server.server_id)
        assert not server.url
        assert not server.headers
        return
    url = httpx2.URL(server.url)
    assert url.scheme == "http"
    assert not url.userinfo
    assert not url.fragment
    if url.host != "localhost":
        assert ipaddress.ip_address(url.host).is_loopback
    total = 0
    seen: set[str] = set()
    for name, value in server.headers:
        lowered = name.lower()
        assert lowered not in RESERVED_HEADER_NAMES
        assert not lowered.startswith(RESERVED_HEADER_PREFIXES)
        assert lowered not in seen
        seen.add(lowered)
        assert not any(ch in value for ch in "\r\n\x00")
        assert len(value.encode()) <= MAX_HEADER_VALUE_BYTES
        total += len(name.encode()) + len(value.encode())
    assert total <= MAX_HEADER_BYTES_PER_SERVER


def fuzz_one(data: bytes) -> None:
    """Check the invariants above on one input. Raises AssertionError on a violation."""
    if not data:
        return
    items, reserved = _inputs(data)
    try:
        accepted = validate_servers(items, reserved_keys=reserved)
    except McpDefinitionError as exc:
        message = exc.message
        assert message
        assert "\n" not in message
        assert "\r" not in message
        assert len(message) <= _MAX_MESSAGE_CHARS
        for secret in _secrets(items):
            assert secret not in message, "a refusal repeated a URL or header value"
        return
    assert len(accepted) == len(items) <= MAX_SERVERS
    keys = [server.key for server in accepted]
    assert len(set(keys)) == len(keys)
    ids = [server.server_id for server in accepted if server.server_id is not None]
    assert len(set(ids)) == len(ids)
    assert not set(keys) & {normalise_key(key) for key in reserved}
    for server in accepted:
        _check_accepted(server)


def main() -> None:
    from _atheris import run

    # Coverage guidance needs the code under test instrumented; it is imported already.
    modules = ["maple_acp.mcp._definitions", "maple_acp.mcp._errors", __name__]
    run("fuzz_mcp_defs", fuzz_one, modules)


if __name__ == "__main__":
    main()
