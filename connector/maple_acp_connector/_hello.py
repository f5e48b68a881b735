"""The optional ``_maple/bridge/hello`` frame: allow-listed environment values for the host.

``MAPLE_ACP_RELAY_ENV`` names a comma-separated allow-list of environment variables. When it is
set and non-empty, the connector sends, as the very first line on the socket::

    {"jsonrpc":"2.0","method":"_maple/bridge/hello","params":{"environment":{NAME: value, ...}}}

with the listed variables that are set, in list order (possibly none). Bounds, enforced here and
again by the host: at most 16 values, each value at most 16 KiB, names plus values at most
32 KiB in all (UTF-8 bytes), no NUL, valid UTF-8. A variable outside these bounds is skipped
and a note naming it (never its value) goes to stderr; the rest are still sent. Names must
look like portable environment variable names (``[A-Za-z_][A-Za-z0-9_]*``).

Pure: no I/O here, so every bound is tested without a socket.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING would import typing; see endpoint.py
if TYPE_CHECKING:
    from collections.abc import Mapping

RELAY_ENV = "MAPLE_ACP_RELAY_ENV"
HELLO_METHOD = "_maple/bridge/hello"
# The relay environment's bounds (docs/protocol.md); the host refuses a hello beyond them.
MAX_VALUES = 16
MAX_VALUE_BYTES = 16 * 1024
MAX_TOTAL_BYTES = 32 * 1024

_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_REST = _NAME_START | frozenset("0123456789")


def _valid_name(name: str) -> bool:
    return bool(name) and name[0] in _NAME_START and all(c in _NAME_REST for c in name)


#: How much of a refused name a note shows: enough to recognise it, never an unbounded line.
_SHOWN_NAME_CHARS = 64


def _shown(name: str) -> str:
    shown = name if name.isprintable() else repr(name)
    if len(shown) > _SHOWN_NAME_CHARS:
        shown = shown[: _SHOWN_NAME_CHARS - 3] + "..."
    return shown


def build_hello(env: Mapping[str, str]) -> tuple[bytes | None, list[str]]:
    """The hello line to send first (``None`` when no allow-list is set) and notes for stderr."""
    allow_list = env.get(RELAY_ENV, "")
    names: list[str] = []
    notes: list[str] = []
    for raw in allow_list.split(","):
        name = raw.strip()
        if not name or name in names:
            continue
        if not _valid_name(name):
            notes.append(f"not relaying {_shown(name)}: not a valid environment variable name")
            continue
        names.append(name)
    if not names:
        return None, notes

    relayed: dict[str, str] = {}
    total = 0
    for name in names:
        value = env.get(name)
        if value is None:
            continue
        if len(relayed) == MAX_VALUES:
            notes.append(f"not relaying {name}: more than {MAX_VALUES} values")
            continue
        if "\0" in value:
            notes.append(f"not relaying {name}: its value contains NUL")
            continue
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            notes.append(f"not relaying {name}: its value is not valid UTF-8")
            continue
        if size > MAX_VALUE_BYTES:
            notes.append(f"not relaying {name}: its value is larger than {MAX_VALUE_BYTES} bytes")
            continue
        cost = len(name) + size
        if total + cost > MAX_TOTAL_BYTES:
            notes.append(
                f"not relaying {name}: relayed names and values would exceed "
                f"{MAX_TOTAL_BYTES} bytes in all"
            )
            continue
        relayed[name] = value
        total += cost

    # json costs a few milliseconds to import; only a connector that relays values pays it.
    import json

    frame = {"jsonrpc": "2.0", "method": HELLO_METHOD, "params": {"environment": relayed}}
    line = json.dumps(frame, ensure_ascii=False, separators=(",", ":")) + "\n"
    return line.encode("utf-8"), notes
