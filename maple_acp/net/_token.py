"""The bearer token that admits network clients: one per host, in ``<data dir>/http-token``.

The file holds 32 random bytes in URL-safe base64 (no padding) and a newline, mode 0600. It is
created on first use (exclusively, so two processes starting at once agree on one token) and
replaced whole by :func:`rotate_token` (written beside it, then renamed). A running listener
re-reads it when the file changes, so a rotation takes effect without a restart.

The token is a secret: nothing here logs it, and no error message carries it.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from maple_acp.net._errors import HttpSetupError

#: The token file inside the data directory.
TOKEN_FILE_NAME: Final = "http-token"
#: Random bytes in a token (256 bits: guessing is hopeless, rate limit or not).
TOKEN_BYTES: Final = 32
#: A token file is one short line; anything larger is not one of ours.
MAX_TOKEN_FILE_BYTES: Final = 1024


def token_path(data_dir: Path) -> Path:
    return data_dir / TOKEN_FILE_NAME


def _new_token() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_BYTES)).rstrip(b"=").decode()


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HttpSetupError(f"the token file {path} is not a regular file")
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise HttpSetupError(
                f"the token file {path} must belong to this user with mode 0600; "
                "remove it and run `maple-acp http-token` to create a new one"
            )
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    token = data.decode("ascii", "replace").strip()
    if len(data) > MAX_TOKEN_FILE_BYTES or not token or not token.isascii():
        raise HttpSetupError(
            f"the token file {path} does not hold a token; run `maple-acp http-token --rotate`"
        )
    return token


def _write_new(path: Path, token: str, *, replace: bool) -> None:
    target = path if not replace else path.with_name(f".{path.name}.{os.getpid()}.new")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(target, flags, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    if replace:
        os.replace(target, path)


def read_or_create_token(data_dir: Path) -> str:
    """The host's token, created (0600) if the file does not exist yet.

    Error handling: :class:`HttpSetupError` (one line, without the token) for a file that is
    not a private regular file of this user or holds no token.
    """
    path = token_path(data_dir)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    try:
        _write_new(path, _new_token(), replace=False)
    except FileExistsError:
        pass  # another process created it first: use theirs
    except OSError as exc:
        raise HttpSetupError(f"cannot create the token file {path}: {exc.strerror}") from None
    return _read(path)


def rotate_token(data_dir: Path) -> str:
    """Replace the token with a new one; clients holding the old one get ``401`` from now."""
    path = token_path(data_dir)
    try:
        _write_new(path, _new_token(), replace=True)
    except OSError as exc:
        raise HttpSetupError(f"cannot write the token file {path}: {exc.strerror}") from None
    return _read(path)


class TokenFile:
    """The token as the listener checks it: re-read when the file changes (a rotation), and
    compared in constant time."""

    def __init__(self, data_dir: Path) -> None:
        self._path = token_path(data_dir)
        self._seen: tuple[int, int, int] | None = None
        self._token = b""
        self.current()

    def current(self) -> bytes:
        try:
            info = os.stat(self._path)
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        except OSError:
            seen = None
        if seen is None or seen != self._seen:
            # A file that went away is recreated (a new token); one that broke is refused:
            # either way no request is admitted with a stale token.
            self._token = read_or_create_token(self._path.parent).encode()
            info = os.stat(self._path)
            self._seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        return self._token

    def matches(self, offered: str) -> bool:
        return hmac.compare_digest(offered.encode("utf-8", "replace"), self.current())
