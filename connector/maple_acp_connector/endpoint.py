"""Where a host listens and how both ends decide whether that place is safe.

The host imports this module (the dependency points host -> connector, never back), so the
host and the connector of one installation always compute the same endpoint.

Identity. The default endpoint is ``maple-acp-<16 hex>.sock``, where the hex digits are the
first 8 bytes of a SHA-256 over the app id and the *installation location*: the canonical
``sys.prefix`` joined with the canonical directory of this package. ``sys.prefix`` keeps
virtual environments apart (a dev venv, a pipx venv, the system interpreter), and the package
directory keeps apart two copies that share one prefix (a user-site install next to a system
one, two editable checkouts). ``sys.executable`` is deliberately not used: resolved, it points
through a venv's symlink to the base interpreter that every venv of that Python shares, so a dev
build and an installed build would meet on one endpoint. A frozen host whose prefix moves on
every start passes ``installation=`` explicitly.

Location. ``$XDG_RUNTIME_DIR`` when it is set, absolute, a directory owned by this user with no
group/other bits and writable; otherwise an owner-checked 0700 ``maple-acp-<uid>`` directory under
the temp dir (``$TMPDIR``, ``$TEMP``, ``$TMP``, else ``/tmp``; macOS sets ``$TMPDIR`` per user).
``--socket PATH`` on the command line, then the ``MAPLE_ACP_SOCKET`` environment variable,
override the default (:func:`resolve_endpoint`); the connector alone then also reads the
``socket`` key of the user's config file (:func:`config_file_socket`), so it finds the host
that ``serve`` and ``status`` find.

Trust. Anything running as the same OS user that can reach the socket is inside the trust
boundary; these checks only keep *other* users out and refuse paths that were tampered with.
"""

from __future__ import annotations

import os
import stat
import sys

# Not typing.TYPE_CHECKING: importing typing costs the connector milliseconds on every session
# start; mypy treats any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

__all__ = [
    "APP_ID",
    "ENDPOINT_ENV",
    "EndpointError",
    "EndpointUnavailable",
    "UnsafeDirectory",
    "UnsafeEndpoint",
    "check_endpoint_socket",
    "check_private_dir",
    "config_file_socket",
    "endpoint_path",
    "ensure_private_dir",
    "installation_location",
    "resolve_endpoint",
]

APP_ID = "maple-acp"
#: The directory name under the XDG config directory (the host's ``maple_acp.config`` agrees).
_APP_DIR = "maple-acp"
ENDPOINT_ENV = "MAPLE_ACP_SOCKET"
# 8 bytes = 64 bits keeps installations apart while the whole path stays well inside the
# 104-byte sun_path of macOS, even under its long per-user $TMPDIR.
_DIGEST_BYTES = 8
_SOCKET_PREFIX = "maple-acp-"
_PRIVATE_DIR_MODE = 0o700
# Any of these bits would let another account reach the socket or rename things in the directory.
_GROUP_OTHER_BITS = 0o077
# Domain separation: the digest can never collide with a hash of the same bytes used elsewhere.
_IDENTITY_TAG = b"maple-acp endpoint v1\0"


class EndpointError(Exception):
    """An endpoint problem, always described in one line that names the path."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(self._describe(_display(self.path), reason))

    @staticmethod
    def _describe(path: str, reason: str) -> str:
        return f"endpoint {path}: {reason}"


class EndpointUnavailable(EndpointError):
    """Nothing to connect to: the host is not running, or the socket cannot be reached."""

    @staticmethod
    def _describe(path: str, reason: str) -> str:
        return f"the maple-acp service is unavailable at {path}: {reason}"


class UnsafeEndpoint(EndpointError):
    """The path exists but is not a private socket of this user; it must not be used."""

    @staticmethod
    def _describe(path: str, reason: str) -> str:
        return f"refusing the endpoint {path}: {reason}"


class UnsafeDirectory(EndpointError):
    """The directory meant to hold the socket is not private to this user."""

    @staticmethod
    def _describe(path: str, reason: str) -> str:
        return f"refusing the socket directory {path}: {reason}"


def _display(path: str) -> str:
    """The path as one printable line (a hostile name must not forge extra stderr lines)."""
    if path.isprintable():
        return path
    return repr(path)


def installation_location() -> str:
    """The canonical location that identifies this installation (see the module docstring)."""
    prefix = os.path.realpath(sys.prefix)
    package_dir = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    return prefix + "\0" + package_dir


def _sha256(data: bytes) -> str:
    # hashlib loads OpenSSL (~4 ms); the builtin digest is enough for an identity and the
    # connector pays its start-up on every ACP session.
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            from hashlib import sha256  # type: ignore[assignment,unused-ignore]
    return str(sha256(data).hexdigest())


def _endpoint_name(app_id: str, installation: str) -> str:
    if not app_id:
        raise ValueError("app_id must not be empty")
    digest = _sha256(_IDENTITY_TAG + app_id.encode("utf-8") + b"\0" + os.fsencode(installation))
    return f"{_SOCKET_PREFIX}{digest[: 2 * _DIGEST_BYTES]}.sock"


def _usable_runtime_dir(env: Mapping[str, str]) -> str | None:
    runtime_dir = env.get("XDG_RUNTIME_DIR", "")
    if not os.path.isabs(runtime_dir):
        return None
    try:
        st = os.stat(runtime_dir)
    except OSError:
        return None
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & _GROUP_OTHER_BITS
        or not os.access(runtime_dir, os.W_OK | os.X_OK)
    ):
        return None
    return runtime_dir


def _temp_root(env: Mapping[str, str]) -> str:
    for name in ("TMPDIR", "TEMP", "TMP"):
        candidate = env.get(name, "")
        if os.path.isabs(candidate) and os.path.isdir(candidate):
            return candidate
    return "/tmp"


def _default_endpoint(
    app_id: str, installation: str | None, env: Mapping[str, str]
) -> tuple[str, str | None]:
    """The default endpoint, and our ``maple-acp-<uid>`` directory when it lives in one."""
    name = _endpoint_name(app_id, installation_location() if installation is None else installation)
    runtime_dir = _usable_runtime_dir(env)
    if runtime_dir is not None:
        return os.path.join(runtime_dir, name), None
    private_dir = os.path.join(_temp_root(env), f"{_SOCKET_PREFIX}{os.geteuid()}")
    return os.path.join(private_dir, name), private_dir


def endpoint_path(
    app_id: str = APP_ID,
    *,
    installation: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """The default endpoint of this installation (no override applied; see the module docstring).

    Pure apart from looking at ``$XDG_RUNTIME_DIR`` and the temp dir: nothing is created. A host
    creates the directory with :func:`ensure_private_dir` before binding.
    """
    from pathlib import Path

    path, _ = _default_endpoint(app_id, installation, os.environ if env is None else env)
    return Path(path)


def _resolve(
    cli_socket: str | None, env: Mapping[str, str], app_id: str = APP_ID
) -> tuple[str, str | None]:
    """The endpoint, and the private directory to verify when it is the default one."""
    if cli_socket:
        return os.path.abspath(cli_socket), None
    override = env.get(ENDPOINT_ENV, "")
    if override:
        return os.path.abspath(override), None
    return _default_endpoint(app_id, None, env)


#: A config file is a few hundred bytes; a larger one is not read for its socket.
_MAX_CONFIG_BYTES = 1024 * 1024


def config_file_socket(env: Mapping[str, str]) -> str | None:
    """The ``socket`` of ``$XDG_CONFIG_HOME/maple-acp/config.toml`` (else
    ``~/.config/maple-acp/config.toml``), absolute; ``None`` when there is no file, no such
    key, or a file ``serve`` would refuse anyway (its own error says what is wrong).

    Cheap: the plain ``socket = "PATH"`` line is read by hand, and ``tomllib`` (which imports
    ``re`` and ``datetime``, several times the connector's own start-up) only for a file that
    mentions ``socket`` in some other form. The file is opened without waiting on a FIFO
    (``O_NONBLOCK``)."""
    base = env.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    path = os.path.join(base, _APP_DIR, "config.toml")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_CONFIG_BYTES:
            return None
        data = os.read(fd, _MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if b"socket" not in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    value = _plain_socket_line(text)
    if value is None:
        import tomllib

        try:
            value = tomllib.loads(text).get("socket")
        except ValueError:
            return None
    if not isinstance(value, str) or not (os.path.isabs(value) or value.startswith("~")):
        return None
    return os.path.abspath(os.path.expanduser(value))


def _plain_socket_line(text: str) -> str | None:
    """The value of a top-level ``socket = "PATH"`` (or ``'PATH'``) line with nothing but a
    comment after it and no escapes in it; ``None`` for any other form (``tomllib`` decides)."""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            return None  # past the top-level keys
        if not line.startswith("socket"):
            continue
        rest = line[len("socket") :].lstrip()
        if not rest.startswith("="):
            continue
        value = rest[1:].strip()
        quote = value[:1]
        if quote not in ('"', "'") or value.startswith(quote * 3):
            return None
        end = value.find(quote, 1)
        after = value[end + 1 :].strip() if end > 0 else "x"
        if end <= 0 or (after and not after.startswith("#")):
            return None
        found = value[1:end]
        return None if quote == '"' and "\\" in found else found
    return None


def resolve_endpoint(
    cli_socket: str | None,
    env: Mapping[str, str] | None = None,
    *,
    app_id: str = APP_ID,
) -> Path:
    """The endpoint to use: ``--socket`` if given, else ``$MAPLE_ACP_SOCKET``, else the default.

    Empty values count as unset. A relative override is made absolute against the current
    directory. The host and the connector both call this, so they agree by construction.
    """
    from pathlib import Path

    path, _ = _resolve(cli_socket, os.environ if env is None else env, app_id)
    return Path(path)


def _mode_text(mode: int) -> str:
    return f"{stat.S_IMODE(mode):04o}"


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a socket"


def _check_owner_only(
    path: str | os.PathLike[str],
    st: os.stat_result,
    is_kind: Callable[[int], bool],
    kind: str,
    error: type[EndpointError],
) -> None:
    """The one rule for the socket and its directory: not a symlink, of the expected kind,
    owned by this user, no group/other bits. Raises ``error`` naming the first breach."""
    if stat.S_ISLNK(st.st_mode):
        raise error(path, "it is a symbolic link")
    if not is_kind(st.st_mode):
        raise error(path, f"it is {_kind(st.st_mode)}, not {kind}")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise error(path, f"it is owned by uid {st.st_uid}, not by this user ({uid})")
    if st.st_mode & _GROUP_OTHER_BITS:
        raise error(path, f"its mode {_mode_text(st.st_mode)} grants access to group or others")


def check_endpoint_socket(path: str | os.PathLike[str]) -> None:
    """Raise unless ``path`` is a Unix socket owned by this user with no group/other bits.

    Raises :class:`EndpointUnavailable` when nothing is there (the host is not running) and
    :class:`UnsafeEndpoint` for a symlink, a non-socket, another owner or a permissive mode.
    The path itself is examined (``lstat``), never what a symlink points to.
    """
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise EndpointUnavailable(path, "no socket there (is the host running?)") from None
    except OSError as exc:
        raise EndpointUnavailable(path, _reason(exc)) from None
    _check_owner_only(path, st, stat.S_ISSOCK, "a socket", UnsafeEndpoint)


def check_private_dir(path: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafeDirectory` unless ``path`` is a real directory private to this user.

    Private means: not a symlink, a directory, owned by this user, no group/other bits.
    ``FileNotFoundError`` propagates unchanged (the caller decides what absence means).
    """
    _check_owner_only(path, os.lstat(path), stat.S_ISDIR, "a directory", UnsafeDirectory)


def ensure_private_dir(path: str | os.PathLike[str]) -> None:
    """Create ``path`` with mode 0700, or verify that the existing one is private to this user.

    An existing directory is never repaired (no chmod, no chown): a directory that is not ours
    or is too open may have been prepared by someone else, so it is refused with
    :class:`UnsafeDirectory`. Only the last component is created; the parent must exist.
    """
    try:
        os.mkdir(path, _PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    else:
        # mkdir's mode is filtered by the umask, which may also have removed owner bits.
        # O_NOFOLLOW: the chmod must reach the directory just made, never a planted symlink.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, _PRIVATE_DIR_MODE)
        finally:
            os.close(fd)
    check_private_dir(path)


def _reason(exc: OSError) -> str:
    """A short, lower-case, one-line reason for an OS error."""
    text = exc.strerror or str(exc) or exc.__class__.__name__
    text = " ".join(text.split())
    return text[:1].lower() + text[1:]
