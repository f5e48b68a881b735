"""Where ``maple-acp`` keeps its files, and how ``serve``'s settings are decided.

Every ``serve`` option can come from four places; the first one that sets it wins:

1. the command-line flag;
2. the environment: ``MAPLE_ACP_SOCKET``, ``MAPLE_ACP_DATA_DIR``, ``MAPLE_ACP_LOG_LEVEL``;
3. the config file: ``$XDG_CONFIG_HOME/maple-acp/config.toml`` (else
   ``~/.config/maple-acp/config.toml``), or the file named by ``serve --config PATH``;
4. the built-in default.

The config file is TOML. Its ``serve`` keys are the flags' names with underscores
(``data_dir``, ``allowed_roots``, ``max_connections``, ...), plus ``tool_env_allow`` (file
only: host variables tool children inherit beyond the built-in list; never a provider's key
variable nor a ``MAPLE_ACP_*`` name). The provider keys (``[[providers]]``,
``default_model``, ``system_prompt``, ``max_rate_limit_wait``) are kept as raw data here and
handed to the provider backend, which validates them. A file that cannot be used, or a path
that is not a regular file (read without blocking, so a FIFO never hangs ``serve``), is one
:class:`ConfigFileError` line naming the file, the key and what is wrong.

Directories the command line creates are made private (0700) component by component
(:func:`make_private_dir`); an existing directory that is not private is refused, never
repaired, with one line that names it, says why and how to fix it.

This module is ``serve``'s settings: where each one comes from, and the private directories
they name. It imports neither ``trio`` nor ``click``: ``status`` and the connector's neighbours
stay fast.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from maple_acp._exceptions import MapleAcpError
from maple_acp._tool_env import check_tool_env_allow
from maple_acp_connector.endpoint import ENDPOINT_ENV, UnsafeDirectory, ensure_private_dir

#: The directory name under the XDG base directories (data and config).
APP_DIR_NAME: Final = "maple-acp"
#: The config file inside the config directory.
CONFIG_FILE_NAME: Final = "config.toml"
#: Environment variables that stand in for ``serve`` flags (the socket one is shared with the
#: connector, which reads nothing else).
SOCKET_ENV: Final = ENDPOINT_ENV
DATA_DIR_ENV: Final = "MAPLE_ACP_DATA_DIR"
LOG_LEVEL_ENV: Final = "MAPLE_ACP_LOG_LEVEL"

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("text", "json")
#: Simultaneous ACP connections at most (docs/protocol.md; the edge enforces it again).
MAX_CONNECTIONS: Final = 8
#: A hello carries at most this many values, so a longer allow-list is a mistake.
MAX_RELAY_NAMES: Final = 16
#: A config file is a few hundred bytes; anything this large is not one.
MAX_CONFIG_BYTES: Final = 1024 * 1024
#: The keys that belong to the provider backend: kept raw and handed over as they are
#: (``max_rate_limit_wait`` is checked here too, so a bad value is refused whatever engine runs).
PROVIDER_KEYS: Final = frozenset(
    {"providers", "default_model", "system_prompt", "max_rate_limit_wait"}
)
#: How long a turn waits out a provider's rate limit that resets later than the retry bound.
DEFAULT_MAX_RATE_LIMIT_WAIT_S: Final = 900.0
#: A provider's ``Retry-After`` beyond a day is not believed, so no longer wait is needed.
MAX_RATE_LIMIT_WAIT_S: Final = 86_400

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PRIVATE_MODE: Final = 0o700
#: The longest provisional grace period accepted (ten years): any longer is a typo, and an
#: infinite one cannot be counted in milliseconds.
MAX_GRACE_S: Final = 315_360_000


class ConfigFileError(MapleAcpError):
    """A config file that cannot be used, described in one line: the file, the key (when one
    is to blame) and what is wrong."""

    def __init__(self, path: str | os.PathLike[str], key: str | None, problem: str) -> None:
        self.path = os.fspath(path)
        self.key = key
        self.problem = problem
        where = f"config file {_shown(self.path)}"
        if key is not None:
            where += f": {_shown(key)}"
        super().__init__(f"{where}: {problem}")


class SettingError(MapleAcpError):
    """An environment variable with a value ``serve`` cannot use (one line naming it)."""


class PrivateDirectoryError(MapleAcpError):
    """A directory that must be private to this user is not, or cannot be made; one line that
    names it, says why and how to fix it."""

    def __init__(self, what: str, path: str | os.PathLike[str], reason: str, fix: str) -> None:
        self.what = what
        self.path = os.fspath(path)
        self.reason = reason
        self.fix = fix
        super().__init__(f"cannot use the {what} {_shown(self.path)}: {reason}; {fix}")


def _shown(path: str) -> str:
    """A path as one printable token (a hostile name must not forge extra lines)."""
    return path if path.isprintable() else repr(path)


# -- places -------------------------------------------------------------------------------------


def _xdg_base(env: Mapping[str, str], name: str, *fallback: str) -> Path:
    """``$name`` when it is an absolute path (the base-directory rules ignore a relative one),
    else ``~/<fallback>``."""
    base = env.get(name, "")
    if os.path.isabs(base):
        return Path(base)
    return Path(os.path.expanduser("~"), *fallback)


def default_data_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/maple-acp``, else ``~/.local/share/maple-acp``."""
    return _xdg_base(env, "XDG_DATA_HOME", ".local", "share") / APP_DIR_NAME


def default_config_file(env: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/maple-acp/config.toml``, else ``~/.config/maple-acp/config.toml``."""
    return _xdg_base(env, "XDG_CONFIG_HOME", ".config") / APP_DIR_NAME / CONFIG_FILE_NAME


def _fix_for(path: str) -> str:
    """How to repair a refused directory, judged from what is there now."""
    try:
        st = os.lstat(path)
    except OSError:
        return "choose another directory"
    if stat.S_ISLNK(st.st_mode):
        return "use the real directory's path instead of the link"
    if not stat.S_ISDIR(st.st_mode):
        return "remove it or choose another directory"
    if st.st_uid != os.geteuid():
        return "choose a directory you own"
    return f"make it private with: chmod 700 {_shown(path)}"


def make_private_dir(path: str | os.PathLike[str], what: str = "directory") -> Path:
    """Create ``path`` and each missing parent with mode 0700, or check that the existing
    ``path`` is a real directory private to this user; return it absolute.

    Existing parents are left as they are (``/tmp`` is shared by design); only ``path`` itself
    must be private. Raises :class:`PrivateDirectoryError` naming ``what`` (``"data
    directory"``, ``"socket directory"``) with the reason and the fix.
    """
    target = Path(os.path.abspath(path))
    missing: list[Path] = []
    probe = target
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        for directory in reversed(missing):
            ensure_private_dir(directory)
        ensure_private_dir(target)
    except UnsafeDirectory as exc:
        # A refused parent is named as such: it is the one the user has to fix.
        label = what if exc.path == os.fspath(target) else f"parent of the {what}"
        raise PrivateDirectoryError(label, exc.path, exc.reason, _fix_for(exc.path)) from None
    except OSError as exc:
        where = exc.filename if isinstance(exc.filename, str) else os.fspath(target)
        reason = " ".join((exc.strerror or str(exc)).split()).lower()
        raise PrivateDirectoryError(what, where, reason, "choose another directory") from None
    return target


# -- the config file ----------------------------------------------------------------------------


def _absolute_path(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    expanded = os.path.expanduser(value)
    if not os.path.isabs(expanded):
        raise ValueError(f"must be an absolute path (or start with ~), not {value!r}")
    return expanded


def _path_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError("must be a list of absolute paths")
    return tuple(_absolute_path(item) for item in value)


def _connections(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONNECTIONS:
        raise ValueError(f"must be an integer from 1 to {MAX_CONNECTIONS}, not {value!r}")
    return value


#: The ACP versions ``serve`` can offer: 2 (the v2 draft beside v1) unless pinned to 1.
PROTOCOL_VERSIONS: Final = (1, 2)


def _protocol_max(value: Any) -> int:
    if type(value) is not int or value not in PROTOCOL_VERSIONS:
        raise ValueError("expected 1 or 2")
    return value


def _seconds(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_GRACE_S  # also refuses NaN and infinity
    ):
        raise ValueError(f"must be a number of seconds from 0 to {MAX_GRACE_S}, not {value!r}")
    return float(value)


def check_rate_limit_wait(value: Any) -> float:
    """``max_rate_limit_wait`` in seconds (0: never wait past the retry bound), or
    ``ValueError`` saying what is wrong with it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_RATE_LIMIT_WAIT_S  # also refuses NaN and infinity
    ):
        raise ValueError(
            f"must be a number of seconds from 0 to {MAX_RATE_LIMIT_WAIT_S}, not {value!r}"
        )
    return float(value)


def check_relay_names(names: Any) -> tuple[str, ...]:
    """The relay allow-list as given, or ``ValueError`` saying what is wrong with it."""
    if not isinstance(names, list | tuple):
        raise ValueError("must be a list of environment variable names")
    for name in names:
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    if len(set(names)) > MAX_RELAY_NAMES:
        raise ValueError(f"at most {MAX_RELAY_NAMES} names")
    return tuple(names)


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, not {value!r}")
        return value.lower()

    return check


#: A model id a config file names, at most (catalog ids are far shorter).
MAX_MODEL_ID_CHARS = 200


def _model_id(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_MODEL_ID_CHARS:
        raise ValueError(f"must be a model id of 1 to {MAX_MODEL_ID_CHARS} characters")
    if any(ch in value for ch in "\r\n\0"):
        raise ValueError("must be a model id on one line")
    return value.strip()


#: The ``serve`` options a config file may set, with the check that normalises each value.
SERVE_KEYS: Final[Mapping[str, Callable[[Any], Any]]] = {
    "socket": _absolute_path,
    "data_dir": _absolute_path,
    "allowed_roots": _path_list,
    "max_connections": _connections,
    "protocol_max": _protocol_max,
    "grace": _seconds,
    "relay_allow": check_relay_names,
    "tool_env_allow": check_tool_env_allow,
    "subagent_model": _model_id,
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(LOG_FORMATS),
}


def _listen(value: Any) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"must be HOST:PORT, not {value!r}")
    return value


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a list of non-empty strings")
    return tuple(value)


#: The keys of the ``[http]`` table (the network listener, off unless ``listen`` is set); each
#: is the ``serve`` option ``http_<key>``.
HTTP_KEYS: Final[Mapping[str, Callable[[Any], Any]]] = {
    "listen": _listen,
    "tls_cert": _absolute_path,
    "tls_key": _absolute_path,
    "allowed_origins": _names,
    "allowed_hosts": _names,
}


def _http_table(value: Any, path: Path) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigFileError(path, "http", "must be a table ([http])")
    found: dict[str, Any] = {}
    for key, item in value.items():
        check = HTTP_KEYS.get(key)
        if check is None:
            known = ", ".join(sorted(HTTP_KEYS))
            raise ConfigFileError(path, f"http.{key}", f"unknown key (known: {known})")
        try:
            found[f"http_{key}"] = check(item)
        except ValueError as exc:
            raise ConfigFileError(path, f"http.{key}", str(exc)) from None
    return found


@attrs.frozen(kw_only=True)
class ConfigFile:
    """What a config file holds: checked ``serve`` values and the raw provider section."""

    #: The file read, or ``None`` when there was none (the default file is optional).
    path: Path | None = None
    serve: Mapping[str, Any] = attrs.field(factory=dict)
    #: ``providers`` / ``default_model`` / ``system_prompt`` exactly as written (TOML types).
    providers: Mapping[str, Any] = attrs.field(factory=dict)


def parse_config(text: str, path: Path) -> ConfigFile:
    """Check one config file's text; raise :class:`ConfigFileError` on the first problem."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(path, None, f"not valid TOML: {exc}") from None
    serve: dict[str, Any] = {}
    providers: dict[str, Any] = {}
    for key, value in document.items():
        if key in PROVIDER_KEYS:
            if key == "max_rate_limit_wait":
                try:
                    check_rate_limit_wait(value)
                except ValueError as exc:
                    raise ConfigFileError(path, key, str(exc)) from None
            providers[key] = value
            continue
        if key == "http":
            serve.update(_http_table(value, path))
            continue
        check = SERVE_KEYS.get(key)
        if check is None:
            known = ", ".join(sorted((*SERVE_KEYS, *PROVIDER_KEYS, "http")))
            raise ConfigFileError(path, key, f"unknown key (known: {known})")
        try:
            serve[key] = check(value)
        except ValueError as exc:
            raise ConfigFileError(path, key, str(exc)) from None
    if "tool_env_allow" in serve:
        try:
            check_tool_env_allow(serve["tool_env_allow"], provider_key_names(providers))
        except ValueError as exc:
            raise ConfigFileError(path, "tool_env_allow", str(exc)) from None
    return ConfigFile(path=path, serve=serve, providers=providers)


def provider_key_names(providers: Mapping[str, Any]) -> frozenset[str]:
    """The ``api_key_env`` names of a raw provider section (the provider backend checks the
    rest of it): variables whose value must never reach a tool."""
    tables = providers.get("providers")
    if not isinstance(tables, list):
        return frozenset()
    return frozenset(
        table["api_key_env"]
        for table in tables
        if isinstance(table, dict) and isinstance(table.get("api_key_env"), str)
    )


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _read_regular_file(path: Path) -> bytes:
    """At most ``MAX_CONFIG_BYTES + 1`` bytes of the regular file ``path``.

    Opened non-blocking, so a FIFO (or a device) answers at once instead of waiting for a
    writer, then refused after ``fstat``: only a regular file is a config file.
    Raises ``FileNotFoundError``, or ``ConfigFileError`` for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigFileError(path, None, (exc.strerror or str(exc)).lower()) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigFileError(path, None, f"{_kind_of(mode)}, not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise ConfigFileError(path, None, (exc.strerror or str(exc)).lower()) from None
    finally:
        os.close(fd)


def load_config(explicit: str | os.PathLike[str] | None, env: Mapping[str, str]) -> ConfigFile:
    """Read ``explicit`` (which must exist), else the default file if there is one. Either
    must be a regular file: a FIFO, a directory or a device is refused at once (never waited
    on)."""
    path = Path(explicit) if explicit is not None else default_config_file(env)
    try:
        data = _read_regular_file(path)
    except FileNotFoundError:
        if explicit is None:
            return ConfigFile()
        raise ConfigFileError(path, None, "no such file") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigFileError(path, None, f"larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(path, None, "not UTF-8 text") from None
    return parse_config(text, path)


# -- precedence ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ServeSettings:
    """``serve``'s options after precedence; ``socket`` ``None`` means the default endpoint."""

    socket: str | None
    data_dir: Path
    allowed_roots: tuple[str, ...] = ()
    max_connections: int = MAX_CONNECTIONS
    #: The newest ACP version a client may get (config: protocol_max; 1 pins v1).
    protocol_max: int = PROTOCOL_VERSIONS[-1]
    grace: float | None = None
    relay_allow: tuple[str, ...] = ()
    #: Host variables tool children inherit beyond the built-in list (config file only).
    tool_env_allow: tuple[str, ...] = ()
    #: The model child sessions run on (config file only; ``None``: their parent's).
    subagent_model: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    #: The network listener (``[http]``; ``serve --http``): off while ``http_listen`` is None.
    http_listen: str | None = None
    http_tls_cert: str | None = None
    http_tls_key: str | None = None
    http_allowed_origins: tuple[str, ...] = ()
    http_allowed_hosts: tuple[str, ...] = ()


#: Environment variables and the ``serve`` option each stands in for.
ENV_KEYS: Final[Mapping[str, str]] = {
    SOCKET_ENV: "socket",
    DATA_DIR_ENV: "data_dir",
    LOG_LEVEL_ENV: "log_level",
}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, key in ENV_KEYS.items():
        raw = env.get(name, "")
        if not raw:
            continue  # empty counts as unset, as for MAPLE_ACP_SOCKET in the connector
        if key == "log_level":
            try:
                values[key] = _choice(LOG_LEVELS)(raw)
            except ValueError as exc:
                raise SettingError(f"{name}: {exc}") from None
        else:
            # A relative path is taken against the current directory, as the connector does.
            values[key] = os.path.abspath(os.path.expanduser(raw))
    return values


def resolve_serve_settings(
    flags: Mapping[str, Any], env: Mapping[str, str], config: ConfigFile
) -> ServeSettings:
    """Apply the precedence: ``flags`` (``None``, or an empty tuple for a repeatable flag,
    means not given) > ``env`` > ``config`` > defaults."""
    chosen: dict[str, Any] = dict(config.serve)
    chosen.update(_from_env(env))
    for key, value in flags.items():
        if value is not None and value != ():
            chosen[key] = value
    data_dir = chosen.pop("data_dir", None)
    rest: dict[str, Any] = {
        key: tuple(v) if isinstance(v, list) else v for key, v in chosen.items()
    }
    return ServeSettings(
        data_dir=Path(data_dir) if data_dir is not None else default_data_dir(env),
        socket=chosen.pop("socket", None),
        **{key: value for key, value in rest.items() if key != "socket"},
    )


def resolve_socket(flag: str | None, env: Mapping[str, str], config: ConfigFile) -> str | None:
    """The socket for commands that talk to a host (``status``, ``sessions``): the same
    precedence as ``serve``, so both find the same host."""
    if flag:
        return flag
    if env.get(SOCKET_ENV):
        return env[SOCKET_ENV]
    socket = config.serve.get("socket")
    return str(socket) if socket is not None else None
