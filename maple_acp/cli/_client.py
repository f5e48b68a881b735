"""A small blocking ACP client for the command line: ``sessions``, ``status``'s neighbours and
the ``demo`` narration.

It speaks newline-delimited JSON-RPC over one file descriptor pair (a Unix socket to the host,
or a connector subprocess's pipes) with the standard library only, so the commands that use it
start without ``trio``. It is deliberately not the test client of ``maple_acp.testing``: a
command that users run must not depend on test helpers.

One request is outstanding at a time; while it waits, every ``session/update`` that arrives is
recorded (and offered to a callback) and every request from the agent is answered by
``on_request`` (or refused with "method not found"). Waiting is bounded by an *idle* timeout:
a host that sends nothing for that long is given up on, however long the whole exchange runs.
"""

from __future__ import annotations

import json
import os
import select
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from maple_acp._exceptions import MapleAcpError
from maple_acp_connector.endpoint import EndpointError, check_endpoint_socket

#: A line from the host is at most the service's own inbound cap (10 MiB) plus framing slack.
MAX_LINE_BYTES: Final = 16 * 1024 * 1024
#: Read size: one typical update line fits many times over.
READ_CHUNK: Final = 65536
#: JSON-RPC "method not found", for requests from the agent this client does not serve.
METHOD_NOT_FOUND: Final = -32601
#: ``list_sessions`` follows at most this many pages (of 100) from one host.
MAX_LIST_PAGES: Final = 1000

#: Answers one request from the agent (method, params) with its result.
RequestHandler = Callable[[str, Any], Any]
#: Sees each ``session/update``'s params as it arrives.
UpdateHandler = Callable[[Mapping[str, Any]], None]


class HostUnavailable(MapleAcpError):
    """No host to talk to, or it went away or went quiet mid-exchange (one line)."""


class AcpCallError(MapleAcpError):
    """The host answered a request with a JSON-RPC error. Its text is the host's message
    alone: a person reading a CLI line has no use for the JSON-RPC code (kept in ``code``)."""

    def __init__(self, method: str, code: int, message: str) -> None:
        self.method = method
        self.code = code
        self.message = message
        super().__init__(f"{method} failed: {message}")


class NotServed(Exception):
    """Raised by a request handler for a method this client does not serve."""


class LineClient:
    """See the module docstring. ``write`` must send all bytes it is given."""

    def __init__(
        self,
        read_fd: int,
        write: Callable[[bytes], None],
        *,
        idle_timeout: float,
        peer: str,
        on_request: RequestHandler | None = None,
        max_line_bytes: int | None = None,
    ) -> None:
        self._fd = read_fd
        self._write = write
        self._idle_timeout = idle_timeout
        self._max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
        #: Whether the host has sent anything: one that closes before that turned us away.
        self._heard = False
        self._peer = peer
        self._on_request = on_request
        self._buffer = bytearray()
        self._next_id = 1
        #: Every ``session/update``'s params, in arrival order.
        self.updates: list[Mapping[str, Any]] = []

    # -- sending ---------------------------------------------------------------------------

    def _send(self, message: Mapping[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        try:
            self._write(line)
        except (ConnectionResetError, BrokenPipeError) as exc:
            if not self._heard:
                raise self._turned_away() from None
            raise HostUnavailable(f"lost the connection to {self._peer}: {_reason(exc)}") from None
        except OSError as exc:
            raise HostUnavailable(f"lost the connection to {self._peer}: {_reason(exc)}") from None

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(
        self, method: str, params: Mapping[str, Any], *, on_update: UpdateHandler | None = None
    ) -> Any:
        """Send ``method`` and return its result; raise :class:`AcpCallError` on an error
        answer and :class:`HostUnavailable` if the host goes away or goes quiet."""
        request_id = self._next_id
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            message = self._receive()
            if not isinstance(message, dict):
                continue
            if "method" in message:
                self._incoming(message, on_update)
            elif message.get("id") == request_id:
                error = message.get("error")
                if isinstance(error, dict):
                    raise AcpCallError(
                        method, int(error.get("code", 0)), str(error.get("message", ""))
                    )
                return message.get("result")

    # -- receiving -------------------------------------------------------------------------

    def _incoming(self, message: Mapping[str, Any], on_update: UpdateHandler | None) -> None:
        method = str(message["method"])
        params = message.get("params")
        if "id" not in message:
            if method == "session/update" and isinstance(params, dict):
                self.updates.append(params)
                if on_update is not None:
                    on_update(params)
            return
        try:
            if self._on_request is None:
                raise NotServed
            result = self._on_request(method, params)
        except NotServed:
            # The reason in data.details too, as every error answer of this project carries it.
            reason = f"{method} is not served"
            error = {"code": METHOD_NOT_FOUND, "message": reason, "data": {"details": reason}}
            self._send({"jsonrpc": "2.0", "id": message["id"], "error": error})
        else:
            self._send({"jsonrpc": "2.0", "id": message["id"], "result": result})

    def _receive(self) -> Any:
        while True:
            end = self._buffer.find(b"\n")
            if end > self._max_line_bytes or (end < 0 and len(self._buffer) > self._max_line_bytes):
                limit = self._max_line_bytes
                raise HostUnavailable(f"{self._peer} sent a line over {limit} bytes")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                if not line.strip():
                    continue
                try:
                    return json.loads(line)
                except ValueError:
                    raise HostUnavailable(f"{self._peer} sent a line that is not JSON") from None
            self._fill()

    def _fill(self) -> None:
        readable, _, _ = select.select([self._fd], [], [], self._idle_timeout)
        if not readable:
            raise HostUnavailable(
                f"{self._peer} sent nothing for {self._idle_timeout:.0f} s; giving up"
            )
        try:
            chunk = os.read(self._fd, READ_CHUNK)
        except (ConnectionResetError, BrokenPipeError):
            if not self._heard:
                # A host at its connection limit closes at accept, unread request and all.
                raise self._turned_away() from None
            raise HostUnavailable(f"{self._peer} reset the connection") from None
        except OSError as exc:
            raise HostUnavailable(f"lost the connection to {self._peer}: {_reason(exc)}") from None
        if not chunk:
            if not self._heard:
                raise self._turned_away()
            raise HostUnavailable(f"{self._peer} closed the connection")
        self._heard = True
        self._buffer += chunk

    def _turned_away(self) -> HostUnavailable:
        return HostUnavailable(
            f"{self._peer} closed the connection without answering (all connections in use?)"
        )


def _reason(exc: OSError) -> str:
    text = " ".join((exc.strerror or str(exc) or type(exc).__name__).split())
    return text[:1].lower() + text[1:]


@contextmanager
def connect_host(
    endpoint: Path, *, idle_timeout: float, max_line_bytes: int | None = None
) -> Iterator[LineClient]:
    """A :class:`LineClient` on the host's socket (checked as the connector checks it), closed
    when the block ends; :class:`HostUnavailable` with one line when there is no host."""
    try:
        check_endpoint_socket(endpoint)
    except EndpointError as exc:
        raise HostUnavailable(str(exc)) from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(idle_timeout)
        try:
            sock.connect(os.fspath(endpoint))
        except OSError as exc:
            raise HostUnavailable(
                f"the maple-acp service is unavailable at {endpoint}: {_reason(exc)}"
            ) from None
        yield LineClient(
            sock.fileno(),
            sock.sendall,
            idle_timeout=idle_timeout,
            peer=f"the service at {endpoint}",
            max_line_bytes=max_line_bytes,
        )
    finally:
        sock.close()


def host_status(endpoint: Path, *, timeout: float, max_bytes: int) -> dict[str, Any]:
    """The host's ``_maple/status`` counters; :class:`HostUnavailable` (one line) when no host
    answers with them within ``timeout``, or answers with more than ``max_bytes``."""
    from maple_acp.wire import STATUS_METHOD

    with connect_host(endpoint, idle_timeout=timeout, max_line_bytes=max_bytes) as client:
        try:
            result = client.request(STATUS_METHOD, {})
        except AcpCallError as exc:
            raise HostUnavailable(
                f"the service at {endpoint} refused the status query: {exc}"
            ) from None
    if not isinstance(result, dict):
        raise HostUnavailable(f"the service at {endpoint} did not return a status")
    return result


def initialize(client: LineClient) -> Mapping[str, Any]:
    """The ``initialize`` every command starts with (protocol version 1, no client features)."""
    result = client.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    return result if isinstance(result, dict) else {}


def list_sessions(client: LineClient, cwd: str | None = None) -> list[dict[str, Any]]:
    """Every session the host lists (all pages), newest first as the host orders them."""
    params: dict[str, Any] = {} if cwd is None else {"cwd": cwd}
    found: list[dict[str, Any]] = []
    seen_cursors: set[str] = set()
    for _ in range(MAX_LIST_PAGES):
        page = client.request("session/list", params)
        if not isinstance(page, dict):
            break
        found.extend(item for item in page.get("sessions", []) if isinstance(item, dict))
        cursor = page.get("nextCursor")
        if not isinstance(cursor, str) or cursor in seen_cursors:
            break
        seen_cursors.add(cursor)
        params = {**params, "cursor": cursor}
    return found


# -- a transcript for a terminal -----------------------------------------------------------------

#: ``sessions show`` prints at most this many lines of one diff (the rest is counted).
MAX_DIFF_LINES: Final = 40
_ROLES: Final = {
    "user_message_chunk": "user",
    "agent_message_chunk": "agent",
    "agent_thought_chunk": "thought",
}
_PLAN_MARKS: Final = {"completed": "[x]", "in_progress": "[>]"}


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters other than newline and tab are shown
    escaped, so a transcript cannot move the cursor or recolour the screen."""
    return "".join(
        ch if ch in "\n\t" or not (ord(ch) < 32 or 127 <= ord(ch) < 160) else f"\\x{ord(ch):02x}"
        for ch in text
    )


def _indented(text: str) -> list[str]:
    return ["  " + line for line in printable(text).split("\n")]


def _block_text(content: Any) -> str:
    if not isinstance(content, dict):
        return ""
    if content.get("type") == "text":
        return str(content.get("text", ""))
    if content.get("type") == "resource_link":
        return f"[{content.get('name') or content.get('uri')}]({content.get('uri')})"
    return f"[{content.get('type')}]"


def _diff_lines(item: Mapping[str, Any]) -> list[str]:
    import difflib

    path = str(item.get("path", ""))
    old = str(item.get("oldText") or "").splitlines()
    new = str(item.get("newText") or "").splitlines()
    label = "new file" if item.get("oldText") is None else "diff"
    lines = [f"  {label} {printable(path)}"]
    body = list(difflib.unified_diff(old, new, lineterm="", n=1))[2:]
    shown = body[:MAX_DIFF_LINES]
    lines.extend("    " + printable(line) for line in shown)
    if len(body) > len(shown):
        lines.append(f"    … {len(body) - len(shown)} more diff lines")
    return lines


class _Tool:
    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}

    def merge(self, update: Mapping[str, Any]) -> None:
        for key, value in update.items():
            if value is not None:
                self.fields[key] = value

    def lines(self) -> list[str]:
        title = printable(str(self.fields.get("title") or self.fields.get("toolCallId")))
        lines = [f"tool: {title} [{self.fields.get('status', 'pending')}]"]
        for location in self.fields.get("locations") or []:
            if isinstance(location, dict) and location.get("path"):
                line = f":{location['line']}" if location.get("line") is not None else ""
                lines.append(f"  at {printable(str(location['path']))}{line}")
        for item in self.fields.get("content") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "diff":
                lines.extend(_diff_lines(item))
            elif item.get("type") == "content":
                lines.extend(_indented(_block_text(item.get("content"))))
        return lines


def render_transcript(updates: list[Mapping[str, Any]]) -> list[str]:
    """The replayed history of one session as lines for a terminal: who said what, tool calls
    with their final state, plans and title changes, in the order they happened."""
    blocks: list[Any] = []  # [role, message id, text parts] lists, _Tool objects, or line lists
    tools: dict[str, _Tool] = {}
    for update in updates:
        kind = update.get("sessionUpdate")
        if kind in _ROLES:
            role = _ROLES[str(kind)]
            message_id = update.get("messageId")
            last = blocks[-1] if blocks else None
            text = _block_text(update.get("content"))
            if isinstance(last, list) and last[:2] == [role, message_id] and len(last) == 3:
                last[2].append(text)
            else:
                blocks.append([role, message_id, [text]])
        elif kind in ("tool_call", "tool_call_update"):
            key = str(update.get("toolCallId"))
            if key not in tools:
                tools[key] = _Tool()
                blocks.append(tools[key])
            tools[key].merge(update)
        elif kind == "plan":
            entries = update.get("entries") or []
            lines = ["plan:"]
            for entry in entries:
                if isinstance(entry, dict):
                    mark = _PLAN_MARKS.get(str(entry.get("status")), "[ ]")
                    lines.append(f"  {mark} {printable(str(entry.get('content', '')))}")
            blocks.append((lines,))
        elif kind == "session_info_update" and update.get("title"):
            blocks.append(([f"title: {printable(str(update['title']))}"],))
    out: list[str] = []
    for block in blocks:
        if isinstance(block, _Tool):
            out.extend(block.lines())
        elif isinstance(block, tuple):
            out.extend(block[0])
        else:
            out.append(f"{block[0]}:")
            out.extend(_indented("".join(block[2])))
    return out
