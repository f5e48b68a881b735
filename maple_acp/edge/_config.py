"""The ACP service's configuration and its per-account persisted state.

The persisted file holds only policy (enabled, allowed roots, connection limit): never a
credential. It is written atomically as a 0600 file inside a 0700 directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from maple_acp._exceptions import MapleAcpError
from maple_acp.edge._sessions import MAX_SESSIONS_PER_CONNECTION
from maple_acp.runtime import within_roots
from maple_acp_connector.endpoint import UnsafeDirectory, ensure_private_dir

logger = logging.getLogger(__name__)

#: More simultaneous ACP connections than this is never allowed (docs/protocol.md).
MAX_CONNECTIONS_LIMIT: Final = 8
#: Inbound frames longer than this end the connection; configurable lower only.
MAX_LINE_BYTES_LIMIT: Final = 10 * 1024 * 1024
#: Outbound admission per connection (docs/protocol.md); configurable lower only.
MAX_OUTBOUND_LINES_LIMIT: Final = 256
MAX_OUTBOUND_BYTES_LIMIT: Final = 4 * 1024 * 1024
#: The persisted file is tiny; anything larger is not ours.
MAX_PERSISTED_BYTES: Final = 64 * 1024


class ConfigError(MapleAcpError, ValueError):
    """An invalid service configuration (one line, safe to show)."""


def _normalise_roots(roots: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for raw in roots:
        if not isinstance(raw, str) or not raw or "\x00" in raw:
            raise ConfigError("allowed roots must be non-empty paths")
        if not os.path.isabs(raw):
            raise ConfigError(f"allowed root is not absolute: {raw!r}"[:300])
        canonical = os.path.realpath(raw)
        if canonical not in out:
            out.append(canonical)
    return tuple(out)


def _roots_converter(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigError("allowed roots must be a list of paths, not one string")
    return _normalise_roots(value)


def _check_max_connections(_: object, __: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("max connections must be an integer")
    if not 1 <= value <= MAX_CONNECTIONS_LIMIT:
        raise ConfigError(f"max connections must be between 1 and {MAX_CONNECTIONS_LIMIT}")


def _check_outbound_lines(_: object, __: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("max outbound lines must be an integer")
    if not 1 <= value <= MAX_OUTBOUND_LINES_LIMIT:
        raise ConfigError(f"max outbound lines must be between 1 and {MAX_OUTBOUND_LINES_LIMIT}")


def _check_outbound_bytes(_: object, __: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("max outbound bytes must be an integer")
    if not 4096 <= value <= MAX_OUTBOUND_BYTES_LIMIT:
        raise ConfigError(f"max outbound bytes must be between 4096 and {MAX_OUTBOUND_BYTES_LIMIT}")


def _check_max_sessions(_: object, __: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("max sessions per connection must be an integer")
    if not 1 <= value <= MAX_SESSIONS_PER_CONNECTION:
        raise ConfigError(
            f"max sessions per connection must be between 1 and {MAX_SESSIONS_PER_CONNECTION}"
        )


def _check_max_line(_: object, __: attrs.Attribute[int], value: int) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1024 <= value <= MAX_LINE_BYTES_LIMIT
    ):
        raise ConfigError(f"max line bytes must be between 1024 and {MAX_LINE_BYTES_LIMIT}")


#: The newest ACP version this service can speak (v2 is the 2.0.0-alpha.12 draft).
MAX_PROTOCOL_VERSION: Final = 2


def _check_protocol_max(_: object, __: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 1 <= value <= MAX_PROTOCOL_VERSION:
        raise ConfigError(f"protocol max must be between 1 and {MAX_PROTOCOL_VERSION}")


@attrs.frozen(kw_only=True)
class AcpServiceConfig:
    """How an :class:`~maple_acp.edge.AcpService` admits connections and sessions.

        ``allowed_roots`` is admission policy for session working directories, not a sandbox: an
        empty tuple admits any absolute directory the host can access. ``allow_session_delete``
        advertises and serves ``session/delete`` (off unless the host opts in); ``protocol_max``
    lets a client that asks for ACP v2 have it (1 unless the host opts in). Roots are canonicalised
        (symlinks resolved) when the config is built.
    """

    allowed_roots: tuple[str, ...] = attrs.field(default=(), converter=_roots_converter)
    max_connections: int = attrs.field(
        default=MAX_CONNECTIONS_LIMIT, validator=_check_max_connections
    )
    max_line_bytes: int = attrs.field(default=MAX_LINE_BYTES_LIMIT, validator=_check_max_line)
    max_outbound_lines: int = attrs.field(
        default=MAX_OUTBOUND_LINES_LIMIT, validator=_check_outbound_lines
    )
    max_outbound_bytes: int = attrs.field(
        default=MAX_OUTBOUND_BYTES_LIMIT, validator=_check_outbound_bytes
    )
    #: Sessions one connection may hold at once; configurable lower only.
    max_sessions_per_connection: int = attrs.field(
        default=MAX_SESSIONS_PER_CONNECTION, validator=_check_max_sessions
    )
    agent_name: str = "maple-acp"
    agent_title: str = "Maple ACP"
    #: Whether clients may delete tasks (``session/delete``); a host opts in.
    allow_session_delete: bool = False
    #: The newest protocol version a client may get: 1 unless the host opts in to 2 (the v2
    #: draft); a client asking for less, or for something else, gets 1.
    protocol_max: int = attrs.field(default=1, validator=_check_protocol_max)

    def admits(self, canonical_dir: str) -> bool:
        """Whether a canonical directory lies under an allowed root (or any, if none set)."""
        return within_roots(canonical_dir, self.allowed_roots)


@attrs.frozen(kw_only=True)
class PersistedServiceState:
    """What survives a host restart for one account: whether the service should run, and the
    policy it runs with."""

    enabled: bool = False
    allowed_roots: tuple[str, ...] = attrs.field(default=(), converter=_roots_converter)
    max_connections: int = attrs.field(
        default=MAX_CONNECTIONS_LIMIT, validator=_check_max_connections
    )

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "version": 1,
                "enabled": self.enabled,
                "allowedRoots": list(self.allowed_roots),
                "maxConnections": self.max_connections,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> PersistedServiceState:
        try:
            raw: Any = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ConfigError("persisted service state is not JSON") from exc
        if not isinstance(raw, dict) or raw.get("version") != 1:
            raise ConfigError("persisted service state has an unknown format")
        enabled = raw.get("enabled", False)
        roots = raw.get("allowedRoots", [])
        max_connections = raw.get("maxConnections", MAX_CONNECTIONS_LIMIT)
        if not isinstance(enabled, bool) or not isinstance(roots, list):
            raise ConfigError("persisted service state has an unknown format")
        return cls(enabled=enabled, allowed_roots=roots, max_connections=max_connections)


def ensure_owner_only_dir(path: Path) -> None:
    """Create ``path`` as a 0700 directory (its parents as ordinary directories), or check that
    the existing one is a real directory owned by this user with no group/other access."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        ensure_private_dir(path)
    except UnsafeDirectory as exc:
        raise ConfigError(str(exc)) from exc


class ServiceStateFile:
    """The per-account persisted state, one file per account under ``directory``.

    The account id is hashed into the file name so no account identifier appears in a path.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def path_for(self, account: str) -> Path:
        digest = hashlib.sha256(account.encode("utf-8")).hexdigest()[:16]
        return self._directory / f"acp-service-{digest}.json"

    def load(self, account: str) -> PersistedServiceState:
        """The saved state, or the defaults (disabled) if nothing was saved. A damaged file is
        logged and treated as disabled: a bad file must never start the listener."""
        path = self.path_for(account)
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_PERSISTED_BYTES + 1)
        except FileNotFoundError:
            return PersistedServiceState()
        if len(data) > MAX_PERSISTED_BYTES:
            logger.warning("ignoring oversized ACP service state file %s", path)
            return PersistedServiceState()
        try:
            return PersistedServiceState.from_json(data)
        except (ConfigError, ValueError, TypeError) as exc:
            logger.warning("ignoring unreadable ACP service state file %s: %s", path, exc)
            return PersistedServiceState()

    def save(self, account: str, state: PersistedServiceState) -> None:
        ensure_owner_only_dir(self._directory)
        path = self.path_for(account)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, state.to_json())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
