"""The bearer token that admits network clients: one per host, in ``<data dir>/http-token``.

The file holds 32 random bytes in URL-safe base64 (no padding) and a newline, mode 0600. It is
created on first use (exclusively, so two processes starting at once agree on one token) and
replaced whole by :func:`rotate_token` (written beside it, then renamed). A running listener
looks at the file on every request and a few times a second besides (:class:`TokenFile`): a
rotation takes effect without a restart, and a file that vanished or that others can read
admits nobody until it is fixed.

The token is a secret: nothing here logs it, and no error message carries it.
"""

from __future__ import annotations

import base64
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from maple_acp.net._errors import HttpSetupError
from maple_acp.net._guard import TokenUnavailable

logger = logging.getLogger(__name__)

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
    """Replace the token with a new one; clients holding the old one get ``401`` from now, and
    a running listener ends their connections within a second (see :class:`TokenFile`)."""
    path = token_path(data_dir)
    try:
        _write_new(path, _new_token(), replace=True)
    except OSError as exc:
        raise HttpSetupError(f"cannot write the token file {path}: {exc.strerror}") from None
    return _read(path)


#: What identifies one state of the token file: a chmod, a chown or a touch changes it, and
#: so does a rename over it (another inode) or a rewrite.
_FileKey = tuple[int, int, int, int, int, int, int]


def _key_of(path: Path) -> _FileKey | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (
        info.st_dev,
        info.st_ino,
        info.st_mtime_ns,
        info.st_ctime_ns,
        info.st_size,
        info.st_mode,
        info.st_uid,
    )


class TokenFile:
    """The token as the listener checks it, compared in constant time.

    The file is looked at (one ``lstat``) on every check and re-read whenever anything about
    it changed, its mode and owner included. A file that vanished, that others can read or
    that holds no token admits nobody (:class:`~maple_acp.net._guard.TokenUnavailable`),
    logged once per problem, until it is fixed (``maple-acp http-token`` makes a new one).
    :attr:`generation` changes whenever the token in force does or none is: a connection
    admitted under an older generation is ended (see ``ConnectionTable``).

    Error handling: :class:`HttpSetupError` from the constructor for a file that cannot be
    used at start (it is created when missing).
    """

    def __init__(self, data_dir: Path) -> None:
        self._path = token_path(data_dir)
        token = read_or_create_token(data_dir).encode()
        self._seen = _key_of(self._path)
        self._token: bytes | None = token
        #: The problem last logged (``None`` while the token is usable).
        self._problem: str | None = None
        #: Changes whenever the token in force changes, or none is.
        self.generation = 0

    def refresh(self) -> None:
        """Look at the file; read it again when anything about it changed."""
        key = _key_of(self._path)
        if key == self._seen:
            return
        self._seen = key
        try:
            if key is None:
                raise FileNotFoundError
            token = _read(self._path).encode()
        except FileNotFoundError:
            self._refuse(
                f"the token file {self._path} is gone; run `maple-acp http-token` to make a new one"
            )
        except HttpSetupError as exc:
            self._refuse(str(exc))
        except OSError as exc:
            self._refuse(f"cannot read the token file {self._path}: {exc.strerror}")
        else:
            if token != self._token:
                self.generation += 1
            self._token = token
            if self._problem is not None:
                logger.info("the token file %s is usable again", self._path)
                self._problem = None

    def _refuse(self, problem: str) -> None:
        if self._token is not None:
            self.generation += 1
            self._token = None
        if problem != self._problem:
            logger.warning("refusing every network request: %s", problem)
            self._problem = problem

    def current(self) -> bytes:
        """The token in force.

        Error handling: :class:`~maple_acp.net._guard.TokenUnavailable` while the file cannot
        be trusted (it was logged once when that began)."""
        self.refresh()
        if self._token is None:
            raise TokenUnavailable(self._problem or "the token file cannot be trusted")
        return self._token

    def matches(self, offered: str) -> bool:
        return hmac.compare_digest(offered.encode("utf-8", "replace"), self.current())
