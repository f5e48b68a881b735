"""Runs the MCP definitions fuzz target under Hypothesis, so a crash it can find fails the suite."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from fuzz_targets import load_fuzz_target
from hypothesis import example, given
from hypothesis import strategies as st

fuzz_one: Callable[[bytes], None] = load_fuzz_target("fuzz_mcp_defs").fuzz_one

_ints = st.integers(-(2**63), 2**63 - 1)
_scalars = st.none() | st.booleans() | _ints | st.text(max_size=20)
_json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
_hosts = st.sampled_from(
    [
        "127.0.0.1",
        "localhost",
        "[::1]",
        "127.1",
        "0x7f.0.0.1",
        "localhost.",
        "[::1%25lo]",
        "example.com",
        "LOCALHOST",
        "127.255.0.9",
        "[::ffff:127.0.0.1]",
        "user:pw@127.0.0.1",
    ]
)
_urls = st.builds(
    lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
    st.sampled_from(["http://", "HTTP://", "https://", "http:/", ""]),
    _hosts,
    st.sampled_from(["", ":0", ":80", ":65535", ":65536", ":", ":8o"]),
    st.sampled_from(["", "/", "/mcp", "/mcp?token=secret-token-1", "/#frag", "\\x", " /a"]),
)
_header_names = st.sampled_from(
    [
        "Authorization",
        "X-Key",
        "x-key",
        "Host",
        "Mcp-Param-A",
        "Proxy-X",
        "X-Forwarded-For",
        "Bad Name",
        "",
        "é",
    ]
) | st.text(max_size=10)
_header_values = st.sampled_from(
    ["Bearer secret-value-0001", "secret-value-0002\r\nX: y", "v" * 16385, " lead", "nul\x00x"]
) | st.text(max_size=20)
_servers = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["http", "http", "acp", "stdio", "sse", "websocket"]),
        "name": st.one_of(st.text(max_size=70), st.sampled_from(["a", "A", "a b", "shell"])),
        "url": st.one_of(_urls, _json_values),
        "headers": st.one_of(
            st.lists(st.tuples(_header_names, _header_values).map(list), max_size=4),
            st.dictionaries(_header_names, _header_values, max_size=3),
            _json_values,
        ),
        "serverId": st.one_of(
            st.sampled_from(["tab-secret-id-1", "tab-secret-id-1", "", " ", "x" * 257, "a\nb"]),
            st.text(max_size=12),
            _json_values,
        ),
    }
)
_documents = st.fixed_dictionaries(
    {
        "servers": st.lists(st.one_of(_servers, _json_values), max_size=18),
        "reserved": st.lists(st.sampled_from(["shell", "a", "A B"]), max_size=2),
    }
)


@given(_documents)
@example(
    {"servers": [{"type": "http", "name": "a", "url": "http://127.0.0.1/"}] * 2, "reserved": []}
)
@example(
    {"servers": [{"type": "http", "name": "x" * 17, "url": "http://[::1]:1/"}] * 17, "reserved": []}
)
@example(
    {
        "servers": [{"type": "acp", "name": n, "serverId": "tab-secret-id-1"} for n in "ab"],
        "reserved": [],
    }
)
def test_structured_definitions(document: dict[str, object]) -> None:
    fuzz_one(b"\x00" + orjson.dumps(document))


@given(st.integers(0, 3), st.binary(max_size=200))
@example(1, b"http://127.0.0.1:8080/mcp")
@example(1, b"http://0x7f.1/")
@example(2, b"X-Ok")
@example(3, b"value\r\nInjected: 1")
def test_raw_bytes(mode: int, body: bytes) -> None:
    fuzz_one(bytes([mode]) + body)


@given(st.integers(1, 1), _urls)
def test_urls(mode: int, url: str) -> None:
    fuzz_one(bytes([mode]) + url.encode())
