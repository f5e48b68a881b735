"""Every definition rule with its bad forms; refusals never repeat secrets."""

from __future__ import annotations

import pytest

from maple_acp.mcp import (
    MAX_HEADER_BYTES_PER_SERVER,
    MAX_HEADER_VALUE_BYTES,
    RESERVED_HEADER_NAMES,
    HttpMcpServer,
    McpDefinitionError,
    SseMcpServer,
    StdioMcpServer,
    normalise_key,
    validate_servers,
)

GOOD_URL = "http://127.0.0.1:8123/mcp"
SECRET = "s3cret-value-never-echoed"


def _refusal(*servers: object, reserved: frozenset[str] = frozenset()) -> str:
    with pytest.raises(McpDefinitionError) as info:
        validate_servers(servers, reserved_keys=reserved)
    message = info.value.message
    assert message == str(info.value)
    assert "\n" not in message
    assert len(message) <= 500
    assert SECRET not in message
    return message


def test_good_definitions_are_kept_in_order_with_keys() -> None:
    servers = validate_servers(
        [
            HttpMcpServer("Git Hub", GOOD_URL, (("Authorization", f"Bearer {SECRET}"),)),
            HttpMcpServer("db.local", "http://localhost:9/x?token=abc"),
            HttpMcpServer("v6", "http://[::1]:80"),
            HttpMcpServer("edge", "http://127.255.255.254/"),
            HttpMcpServer("Ünï", "http://LOCALHOST:1"),
        ]
    )
    assert [(s.index, s.name, s.key) for s in servers] == [
        (0, "Git Hub", "github"),
        (1, "db.local", "db_local"),
        (2, "v6", "v6"),
        (3, "edge", "edge"),
        (4, "Ünï", "_n_"),
    ]
    assert servers[0].headers == (("Authorization", f"Bearer {SECRET}"),)
    assert SECRET not in repr(servers)
    assert "token=abc" not in repr(servers)


def test_no_servers_is_fine() -> None:
    assert validate_servers([]) == ()


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Plain", "plain"),
        ("  spaced\tout\n", "spacedout"),
        ("a.b/c:d", "a_b_c_d"),
        ("keep_-this", "keep_-this"),
        ("émoji🙂", "_moji_"),
    ],
)
def test_key_normalisation(name: str, key: str) -> None:
    assert normalise_key(name) == key


def test_stdio_refused() -> None:
    assert _refusal(StdioMcpServer("local")) == (
        "MCP server #0 ('local'): stdio MCP servers are not supported; use http or acp"
    )


def test_sse_refused() -> None:
    assert _refusal(HttpMcpServer("ok", GOOD_URL), SseMcpServer("events")) == (
        "MCP server #1 ('events'): SSE MCP servers are not supported; use http or acp"
    )


@pytest.mark.parametrize("item", [None, "http://127.0.0.1/", {"name": "x"}, 3])
def test_non_definitions_refused(item: object) -> None:
    assert _refusal(item) == "MCP server #0: unsupported MCP server definition"


def test_non_iterable_refused() -> None:
    with pytest.raises(McpDefinitionError, match="must be a list"):
        validate_servers(5)  # type: ignore[arg-type]


def test_at_most_sixteen_servers() -> None:
    sixteen = [HttpMcpServer(f"s{i}", GOOD_URL) for i in range(16)]
    assert len(validate_servers(sixteen)) == 16
    assert _refusal(*sixteen, HttpMcpServer("s16", GOOD_URL)) == (
        "at most 16 MCP servers are allowed per session"
    )


@pytest.mark.parametrize("name", ["", "x" * 65, 7, None])
def test_name_length(name: object) -> None:
    message = _refusal(HttpMcpServer(name, GOOD_URL))  # type: ignore[arg-type]
    assert message.endswith("name must be 1 to 64 characters")


def test_name_of_64_characters_is_fine() -> None:
    assert validate_servers([HttpMcpServer("x" * 64, GOOD_URL)])[0].key == "x" * 64


@pytest.mark.parametrize("name", ["tab\there", "nul\x00", "del\x7f", "line\nbreak"])
def test_name_control_characters(name: str) -> None:
    assert "control characters" in _refusal(HttpMcpServer(name, GOOD_URL))


def test_blank_name() -> None:
    assert "other than whitespace" in _refusal(HttpMcpServer("   ", GOOD_URL))


@pytest.mark.parametrize(("first", "second"), [("Git Hub", "github"), ("a.b", "a/b"), ("X", "x")])
def test_keys_must_be_unique(first: str, second: str) -> None:
    message = _refusal(HttpMcpServer(first, GOOD_URL), HttpMcpServer(second, GOOD_URL))
    assert message.startswith("MCP server #1")
    assert "is not unique after normalisation" in message


@pytest.mark.parametrize("name", ["Shell", "s hell", "SHELL"])
def test_reserved_keys(name: str) -> None:
    message = _refusal(HttpMcpServer(name, GOOD_URL), reserved=frozenset({"shell"}))
    assert message == f"MCP server #0 ({name!r}): name 'shell' is reserved by the host"


BAD_URLS = [
    # scheme
    "https://127.0.0.1/mcp",
    "HTTP://127.0.0.1/mcp",
    "Http://127.0.0.1/mcp",
    "ftp://127.0.0.1/",
    "//127.0.0.1/mcp",
    "127.0.0.1:80/mcp",
    "http:/127.0.0.1/mcp",
    "http:127.0.0.1",
    # hosts that are not loopback, or not spelled canonically
    "http://example.com/mcp",
    "http://10.0.0.1/",
    "http://0.0.0.0/",
    "http://128.0.0.1/",
    "http://127.1/",
    "http://0x7f.0.0.1/",
    "http://0177.0.0.1/",
    "http://127.0.0.01/",
    "http://2130706433/",
    "http://localhost./",
    "http://localhost.example.com/",
    "http://sub.localhost/",
    "http://[::2]/",
    "http://[::1%25eth0]/",
    "http://[::1%eth0]/",
    "http://[0:0:0:0:0:0:0:1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::1/",
    "http://::1/",
    "http://[127.0.0.1]/",
    "http:///mcp",
    "http://",
    # ports
    "http://127.0.0.1:0/",
    "http://127.0.0.1:65536/",
    "http://127.0.0.1:/mcp",
    "http://127.0.0.1:8o/",
    "http://127.0.0.1:123456/",
    "http://127.0.0.1:-1/",
    # smuggling characters
    "http://127.0.0.1\\@evil.example/",
    "http://127.0.0.1 /mcp",
    " http://127.0.0.1/mcp",
    "http://127.0.0.1/mcp\n",
    "http://127.0.0.1/m\tcp",
    "http://127.0.0.1/\x00",
    "http://127.0.0.1/é",
    "http://127.0.0.1%2f@evil/",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_urls(url: str) -> None:
    message = _refusal(HttpMcpServer("srv", url))
    assert message.startswith("MCP server #0 ('srv'): URL ")
    if len(url.strip()) > len("http://"):
        assert url.strip() not in message


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@127.0.0.1/mcp",
        f"http://{SECRET}@localhost/mcp",
        f"http://127.0.0.1@{SECRET}/",
    ],
)
def test_userinfo_refused_without_echo(url: str) -> None:
    message = _refusal(HttpMcpServer("srv", url))
    assert message == "MCP server #0 ('srv'): URL must not contain credentials"


@pytest.mark.parametrize(
    "url", [f"http://127.0.0.1/mcp#{SECRET}", "http://127.0.0.1/#", f"http://[::1]/?{SECRET}#x"]
)
def test_fragment_refused(url: str) -> None:
    assert (
        _refusal(HttpMcpServer("srv", url)) == "MCP server #0 ('srv'): URL must not have a fragment"
    )


def test_query_is_allowed_but_never_echoed() -> None:
    (server,) = validate_servers([HttpMcpServer("q", f"http://127.0.0.1:1/mcp?key={SECRET}")])
    assert SECRET not in repr(server)


def test_overlong_url() -> None:
    assert "longer than 2048" in _refusal(HttpMcpServer("srv", "http://127.0.0.1/" + "a" * 2048))


@pytest.mark.parametrize("url", [None, 7, b"http://127.0.0.1/", ""])
def test_url_type(url: object) -> None:
    assert "URL must be a non-empty string" in _refusal(HttpMcpServer("srv", url))  # type: ignore[arg-type]


def _header_refusal(*pairs: object) -> str:
    message = _refusal(HttpMcpServer("srv", GOOD_URL, pairs))  # type: ignore[arg-type]
    assert message.startswith("MCP server #0 ('srv'): ")
    return message


@pytest.mark.parametrize("name", sorted(RESERVED_HEADER_NAMES))
def test_reserved_header_names(name: str) -> None:
    for spelling in (name, name.upper(), name.title()):
        message = _header_refusal(("X-Ok", "1"), (spelling, SECRET))
        assert message.endswith(f"header #1 uses the reserved name {name!r}")


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("Mcp-Param-Region", "mcp-param-"),
        ("MCP-PARAM-x", "mcp-param-"),
        ("Proxy-Connection", "proxy-"),
        ("proxy-anything", "proxy-"),
        ("X-Forwarded-For", "x-forwarded-"),
        ("x-forwarded-host", "x-forwarded-"),
    ],
)
def test_reserved_header_prefixes(name: str, prefix: str) -> None:
    assert _header_refusal((name, SECRET)).endswith(
        f"header #0 uses the reserved prefix {prefix!r}"
    )


@pytest.mark.parametrize(
    "pairs",
    [
        (("Authorization", "a"), ("authorization", SECRET)),
        (("X-Key", "a"), ("X-KEY", SECRET)),
    ],
)
def test_duplicate_headers(pairs: tuple[tuple[str, str], ...]) -> None:
    assert _header_refusal(*pairs).endswith("header #1 repeats an earlier header name")


@pytest.mark.parametrize(
    "name", ["", "Bad Name", "colon:", "new\nline", "tab\t", "é", "(paren)", "a/b", "x\x00"]
)
def test_header_name_must_be_a_token(name: str) -> None:
    message = _header_refusal((name, SECRET))
    assert message.endswith("header #0 has an invalid name")
    if name.strip():
        assert name not in message


@pytest.mark.parametrize(
    "value",
    [
        f"{SECRET}\r\nX-Injected: 1",
        f"{SECRET}\n",
        f"{SECRET}\r",
        f"{SECRET}\x00",
    ],
)
def test_header_value_cr_lf_nul(value: str) -> None:
    assert _header_refusal(("X-Key", value)).endswith("header #0 value contains CR, LF or NUL")


@pytest.mark.parametrize(
    "value", [f" {SECRET}", f"{SECRET} ", f"{SECRET}\x01", f"{SECRET}é", f"{SECRET}\x7f"]
)
def test_header_value_must_be_visible_ascii(value: str) -> None:
    assert _header_refusal(("X-Key", value)).endswith(
        "value must be visible ASCII without leading or trailing whitespace"
    )


def test_header_value_size() -> None:
    ok = "v" * MAX_HEADER_VALUE_BYTES
    assert validate_servers([HttpMcpServer("srv", GOOD_URL, (("X-Key", ok),))])
    message = _header_refusal(("X-Key", ok + "v"))
    assert message.endswith("header #0 value is larger than 16384 bytes")


def test_header_total_size_per_server() -> None:
    value = "v" * (MAX_HEADER_VALUE_BYTES - 10)
    fits = tuple((f"X-K{i}", value) for i in range(4))
    assert sum(len(n) + len(v) for n, v in fits) <= MAX_HEADER_BYTES_PER_SERVER
    assert validate_servers([HttpMcpServer("srv", GOOD_URL, fits)])
    message = _header_refusal(*fits, ("X-K4", value))
    assert message.endswith("headers are larger than 65536 bytes in total")
    # The limit is per server: two full servers are fine.
    assert validate_servers(
        [HttpMcpServer("a", GOOD_URL, fits), HttpMcpServer("b", GOOD_URL, fits)]
    )


@pytest.mark.parametrize(
    "headers",
    [None, "Authorization: x", {"X-Key": SECRET}],
)
def test_headers_container_type(headers: object) -> None:
    message = _refusal(HttpMcpServer("srv", GOOD_URL, headers))  # type: ignore[arg-type]
    assert message.endswith("headers must be a list of name/value pairs")


@pytest.mark.parametrize(
    "pair", [("X-Key",), ("X-Key", SECRET, "x"), "X-Key", None, ("X-Key", 5), (5, SECRET)]
)
def test_header_pair_shape(pair: object) -> None:
    message = _header_refusal(pair)
    assert "header #0 must" in message


def test_empty_header_value_is_allowed() -> None:
    (server,) = validate_servers([HttpMcpServer("srv", GOOD_URL, (("X-Empty", ""),))])
    assert server.headers == (("X-Empty", ""),)


def test_name_is_bounded_in_messages() -> None:
    message = _refusal(HttpMcpServer("n" * 64, "https://127.0.0.1/"))
    assert len(message) < 200
