"""Client-supplied MCP server definitions and their validation.

Everything here is pure: a definition is refused before any socket opens. A refusal message names
the server by position and (sanitised) name and says which rule failed; it never repeats a header
value, a header name the client chose, or any part of the URL.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Iterable
from typing import Final

import attrs
import httpx2

from maple_acp._text import one_line
from maple_acp.mcp._errors import McpDefinitionError

#: A lease may carry at most this many transient servers (docs/protocol.md).
MAX_SERVERS: Final = 16
#: Server names are shown to the model and the client; keep them short (docs/protocol.md).
MAX_NAME_CHARS: Final = 64
#: One header value; larger values are not credentials but payloads (docs/protocol.md).
MAX_HEADER_VALUE_BYTES: Final = 16 * 1024
#: All header names and values of one server together (docs/protocol.md).
MAX_HEADER_BYTES_PER_SERVER: Final = 64 * 1024
#: A loopback endpoint URL has no business being longer; bounds parsing work on hostile input.
MAX_URL_CHARS: Final = 2048
#: A client-side server's id is echoed in every ``mcp/message``; an id is a handle, not a payload.
MAX_SERVER_ID_CHARS: Final = 256
#: Position and name are all a refusal message says about a server.
_MAX_NAME_IN_MESSAGE: Final = 64

#: Headers the transport or the MCP protocol owns; a client may not set or override them.
RESERVED_HEADER_NAMES: Final = frozenset(
    {
        "accept",
        "connection",
        "content-length",
        "content-type",
        "forwarded",
        "host",
        "keep-alive",
        "last-event-id",
        "mcp-method",
        "mcp-name",
        "mcp-protocol-version",
        "mcp-session-id",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "via",
        "x-real-ip",
    }
)
#: Header families owned by the MCP protocol or by proxies.
RESERVED_HEADER_PREFIXES: Final = ("mcp-param-", "proxy-", "x-forwarded-")

# RFC 9110 token characters.
_HEADER_NAME_RE: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Visible ASCII with single inner spaces/tabs: what the HTTP/1.1 client accepts verbatim. Anything
# else would be rejected later by the HTTP library with an error that quotes the value.
_HEADER_VALUE_RE: Final = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")
# host[:port] with the host either a bracketed IPv6 literal or a plain name / dotted quad.
_NETLOC_RE: Final = re.compile(
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(?::(?P<port>[0-9]{1,5}))?"
)
_IPV4_LOOPBACK: Final = ipaddress.IPv4Network("127.0.0.0/8")
_IPV6_LOOPBACK: Final = ipaddress.IPv6Address("::1")


@attrs.frozen
class HttpMcpServer:
    """A streamable-HTTP MCP server as a client supplied it (unvalidated)."""

    name: str
    url: str = attrs.field(repr=False)
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)


@attrs.frozen
class StdioMcpServer:
    """A stdio MCP server definition: recognised so it can be refused precisely."""

    name: str


@attrs.frozen
class SseMcpServer:
    """An SSE MCP server definition: recognised so it can be refused precisely."""

    name: str


@attrs.frozen
class AcpMcpServer:
    """A server that lives in the client, reached through ``mcp/message`` requests on the
    connection that declared it (unvalidated)."""

    name: str
    server_id: str = attrs.field(repr=False)


McpServerDefinition = HttpMcpServer | StdioMcpServer | SseMcpServer | AcpMcpServer


@attrs.frozen
class ValidatedServer:
    """A definition that passed every rule. ``url``, ``headers`` and ``server_id`` never appear
    in its repr. A client-side server has a ``server_id`` and no URL or headers."""

    index: int
    name: str
    key: str
    url: str = attrs.field(default="", repr=False)
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)
    server_id: str | None = attrs.field(default=None, repr=False)


def normalise_key(name: str) -> str:
    """The server's key in tool ids: whitespace dropped, ``[A-Za-z0-9_-]`` kept, every other
    character mapped to ``_``, lowercased."""
    out: list[str] = []
    for ch in name:
        if ch.isspace():
            continue
        if ch.isascii() and (ch.isalnum() or ch in "_-"):
            out.append(ch.lower())
        else:
            out.append("_")
    return "".join(out)


def describe_server(index: int, name: object) -> str:
    """How messages refer to a server: its position and, when printable, its bounded name."""
    if isinstance(name, str) and name:
        shown = one_line(name, limit=_MAX_NAME_IN_MESSAGE)
        return f"MCP server #{index} ({shown!r})"
    return f"MCP server #{index}"


def validate_servers(
    servers: Iterable[object], *, reserved_keys: frozenset[str] = frozenset()
) -> tuple[ValidatedServer, ...]:
    """Check every client-supplied definition; return them validated, in order.

    Raises :class:`McpDefinitionError` for the first rule broken (and for any input that is not
    a definition at all). Nothing is connected here.
    """
    try:
        items = list(servers)
    except Exception:
        raise McpDefinitionError("MCP servers must be a list of server definitions") from None
    if len(items) > MAX_SERVERS:
        raise McpDefinitionError(f"at most {MAX_SERVERS} MCP servers are allowed per session")
    reserved = frozenset(normalise_key(k) for k in reserved_keys if isinstance(k, str))
    seen_keys: set[str] = set()
    seen_ids: set[str] = set()
    validated: list[ValidatedServer] = []
    for index, item in enumerate(items):
        validated.append(_validate_one(index, item, reserved, seen_keys, seen_ids))
    return tuple(validated)


def _validate_one(
    index: int,
    item: object,
    reserved: frozenset[str],
    seen_keys: set[str],
    seen_ids: set[str],
) -> ValidatedServer:
    name = getattr(item, "name", None) if isinstance(item, McpServerDefinition) else None
    where = describe_server(index, name)
    if isinstance(item, StdioMcpServer):
        raise McpDefinitionError(f"{where}: stdio MCP servers are not supported; use http or acp")
    if isinstance(item, SseMcpServer):
        raise McpDefinitionError(f"{where}: SSE MCP servers are not supported; use http or acp")
    if not isinstance(item, HttpMcpServer | AcpMcpServer):
        raise McpDefinitionError(f"{where}: unsupported MCP server definition")
    key = _check_name(where, item.name, reserved, seen_keys)
    if isinstance(item, AcpMcpServer):
        server_id = _check_server_id(where, item.server_id, seen_ids)
        return ValidatedServer(index=index, name=item.name, key=key, server_id=server_id)
    _check_url(where, item.url)
    headers = _check_headers(where, item.headers)
    return ValidatedServer(index=index, name=item.name, key=key, url=item.url, headers=headers)


def _check_name(where: str, name: object, reserved: frozenset[str], seen_keys: set[str]) -> str:
    """The server's key in tool ids, once its name passed every rule."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise McpDefinitionError(f"{where}: name must be 1 to {MAX_NAME_CHARS} characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise McpDefinitionError(f"{where}: name must not contain control characters")
    key = normalise_key(name)
    if not key:
        raise McpDefinitionError(f"{where}: name must contain a character other than whitespace")
    if key in reserved:
        raise McpDefinitionError(f"{where}: name {key!r} is reserved by the host")
    if key in seen_keys:
        raise McpDefinitionError(f"{where}: name {key!r} is not unique after normalisation")
    seen_keys.add(key)
    return key


def _check_server_id(where: str, server_id: object, seen_ids: set[str]) -> str:
    """A client-side server's id: a non-empty, bounded handle, one server per id. The refusal
    never repeats it."""
    if not isinstance(server_id, str) or not server_id.strip():
        raise McpDefinitionError(f"{where}: serverId must be a non-empty string")
    if len(server_id) > MAX_SERVER_ID_CHARS:
        raise McpDefinitionError(
            f"{where}: serverId is longer than {MAX_SERVER_ID_CHARS} characters"
        )
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in server_id):
        raise McpDefinitionError(f"{where}: serverId must not contain control characters")
    if server_id in seen_ids:
        raise McpDefinitionError(f"{where}: serverId repeats the id of an earlier server")
    seen_ids.add(server_id)
    return server_id


def _check_url(where: str, url: object) -> None:
    """Accept only ``http://``, then ``localhost`` or a loopback IP literal, an optional port,
    and a path and query.

    Three parsers (ours, :mod:`urllib.parse`, and the HTTP client's) must agree on scheme, host
    and port; any disagreement is a refusal, because it is exactly where smuggling lives.
    """
    bad = f"{where}: URL must be plain http:// to localhost or a loopback IP address"
    if not isinstance(url, str) or not url:
        raise McpDefinitionError(f"{where}: URL must be a non-empty string")
    if len(url) > MAX_URL_CHARS:
        raise McpDefinitionError(f"{where}: URL is longer than {MAX_URL_CHARS} characters")
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in url) or "\\" in url:
        raise McpDefinitionError(
            f"{where}: URL contains whitespace, control or non-ASCII characters"
        )
    if not url.startswith("http://"):
        raise McpDefinitionError(bad)
    if "#" in url:
        raise McpDefinitionError(f"{where}: URL must not have a fragment")
    rest = url[len("http://") :]
    netloc = re.split(r"[/?]", rest, maxsplit=1)[0]
    if "@" in netloc:
        raise McpDefinitionError(f"{where}: URL must not contain credentials")
    match = _NETLOC_RE.fullmatch(netloc)
    if match is None:
        raise McpDefinitionError(bad)
    raw_host = match["host"]
    port = int(match["port"]) if match["port"] is not None else None
    if port is not None and not 1 <= port <= 65535:
        raise McpDefinitionError(f"{where}: URL port must be between 1 and 65535")
    host = _loopback_host(raw_host)
    if host is None:
        raise McpDefinitionError(bad)
    try:
        split = urllib.parse.urlsplit(url)
        split_port = split.port
        parsed = httpx2.URL(url)
    except Exception:
        raise McpDefinitionError(bad) from None
    effective_port = 80 if port is None else port
    agree = (
        split.scheme == "http"
        and split.hostname == host
        and (split_port or 80) == effective_port
        and not split.username
        and not split.password
        and parsed.scheme == "http"
        and parsed.host == host
        and (parsed.port or 80) == effective_port
        and not parsed.userinfo
        and not parsed.fragment
    )
    if not agree:
        raise McpDefinitionError(bad)


def _loopback_host(raw: str) -> str | None:
    """The host as the parsers spell it (lowercase, no brackets) if it is loopback, else None."""
    if raw.startswith("["):
        inner = raw[1:-1]
        try:
            address = ipaddress.IPv6Address(inner)
        except ValueError:
            return None
        # Only the canonical spelling of the exact loopback: no zone id, no expanded,
        # IPv4-mapped or IPv4-compatible forms that parsers might normalise differently.
        return inner if address == _IPV6_LOOPBACK and inner == str(address) else None
    if raw.lower() == "localhost":
        return "localhost"
    try:
        v4 = ipaddress.IPv4Address(raw)
    except ValueError:
        return None
    # ipaddress only accepts the canonical dotted quad, so "127.1" or "0x7f.0.0.1" never get here.
    return raw if v4 in _IPV4_LOOPBACK and str(v4) == raw else None


def _check_headers(where: str, headers: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(headers, tuple | list):
        raise McpDefinitionError(f"{where}: headers must be a list of name/value pairs")
    seen: set[str] = set()
    total = 0
    checked: list[tuple[str, str]] = []
    for position, pair in enumerate(headers):
        at = f"{where}: header #{position}"
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise McpDefinitionError(f"{at} must be a name/value pair")
        name, value = pair
        if not isinstance(name, str) or not isinstance(value, str):
            raise McpDefinitionError(f"{at} must have a string name and a string value")
        if not _HEADER_NAME_RE.fullmatch(name):
            raise McpDefinitionError(f"{at} has an invalid name")
        lowered = name.lower()
        if lowered in RESERVED_HEADER_NAMES:
            raise McpDefinitionError(f"{at} uses the reserved name {lowered!r}")
        for prefix in RESERVED_HEADER_PREFIXES:
            if lowered.startswith(prefix):
                raise McpDefinitionError(f"{at} uses the reserved prefix {prefix!r}")
        if lowered in seen:
            raise McpDefinitionError(f"{at} repeats an earlier header name")
        seen.add(lowered)
        if any(ch in value for ch in "\r\n\x00"):
            raise McpDefinitionError(f"{at} value contains CR, LF or NUL")
        if len(value) > MAX_HEADER_VALUE_BYTES:
            raise McpDefinitionError(f"{at} value is larger than {MAX_HEADER_VALUE_BYTES} bytes")
        if not _HEADER_VALUE_RE.fullmatch(value):
            raise McpDefinitionError(
                f"{at} value must be visible ASCII without leading or trailing whitespace"
            )
        total += len(name) + len(value)
        if total > MAX_HEADER_BYTES_PER_SERVER:
            raise McpDefinitionError(
                f"{where}: headers are larger than {MAX_HEADER_BYTES_PER_SERVER} bytes in total"
            )
        checked.append((name, value))
    return tuple(checked)
