"""Opening a path beneath a directory fd so that no component, however it is swapped while we
work, leads outside that directory.

The path is given as its components (no ``..``, no ``.``, no empty names, no ``/``: the caller
normalised it). Every component is resolved relative to a directory fd, never through a path
string re-resolved later, and no symlink is followed anywhere. Where the kernel has ``openat2``
(Linux 5.6 and later) one call with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` does it; Python
has no binding for it, so it is called through ``syscall``. Elsewhere, or where a seccomp
filter refuses it, each directory is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the
previous one and the last component with ``O_NOFOLLOW``.

Resource handling: every intermediate fd is closed before returning or raising; the caller owns
only the fd returned and must close it.

Error handling: ``OSError`` from the kernel goes to the caller as is, except that a component
that is a symlink is always ``ELOOP`` (``O_DIRECTORY | O_NOFOLLOW`` alone would say
``ENOTDIR``, so the walk opens a directory with ``O_PATH | O_NOFOLLOW`` and checks with
``fstat`` what it got). Whether ``openat2`` works is probed once, with a call that cannot fail for
any other reason; ``ENOSYS``, ``EPERM`` (seccomp) or ``EINVAL`` (an older kernel) there means
the walk is used from then on.

Cancellation: plain blocking system calls; callers run them on a worker thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import sys
from collections.abc import Sequence
from typing import Any

#: ``openat2``'s number: the same on every architecture that got it in the unified table.
SYS_OPENAT2 = 437
#: Architectures whose syscall table has ``openat2`` at ``SYS_OPENAT2`` (alpha and mips do not).
_OPENAT2_MACHINES = frozenset(
    {"x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "armv7l", "armv6l", "riscv64"}
    | {"ppc64le", "ppc64", "s390x", "loongarch64"}
)
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# O_PATH (Linux): a directory we only walk through needs no read permission, just search.
_PATH_FLAG: int = getattr(os, "O_PATH", 0)
DIRECTORY_FLAGS = (_PATH_FLAG or os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_PROBE_ERRNOS = frozenset({errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG})

#: ``None``: probe ``openat2`` on first use; ``False``: always walk (tests force it).
use_openat2: bool | None = None


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


def _libc_syscall() -> Any:
    if not sys.platform.startswith("linux") or platform.machine() not in _OPENAT2_MACHINES:
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function


_syscall = _libc_syscall()


def _openat2(dir_fd: int, name: str, flags: int, mode: int) -> int:
    assert _syscall is not None
    # RESOLVE_NO_SYMLINKS refuses a symlink anywhere with ELOOP; O_NOFOLLOW would instead let
    # O_PATH open a final symlink itself (and O_DIRECTORY then say ENOTDIR).
    flags &= ~os.O_NOFOLLOW
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE)
    fd = _syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_long(dir_fd),
        ctypes.c_char_p(os.fsencode(name)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), name)
    return int(fd)


def _openat2_works(dir_fd: int) -> bool:
    global use_openat2
    if use_openat2 is None:
        if _syscall is None:
            use_openat2 = False
        else:
            try:
                os.close(_openat2(dir_fd, ".", DIRECTORY_FLAGS, 0))
            except OSError as exc:
                if exc.errno not in _PROBE_ERRNOS:
                    raise
                use_openat2 = False
            else:
                use_openat2 = True
    return use_openat2


def open_beneath(dir_fd: int, names: Sequence[str], flags: int, mode: int = 0o666) -> int:
    """Open ``names`` joined, beneath ``dir_fd``, following no symlink; ``flags`` apply to the
    last component (``dir_fd`` itself when ``names`` is empty). Raises ``OSError``."""
    flags |= os.O_NOFOLLOW | _CLOEXEC
    if not names:
        return os.open(".", flags, mode, dir_fd=dir_fd)
    if _openat2_works(dir_fd):
        return _openat2(dir_fd, "/".join(names), flags, mode)
    parent = open_directory_beneath(dir_fd, names[:-1])
    try:
        return os.open(names[-1], flags, mode, dir_fd=parent)
    finally:
        os.close(parent)


def open_directory_beneath(dir_fd: int, names: Sequence[str], *, create: bool = False) -> int:
    """An ``O_PATH`` fd of the directory ``names`` name beneath ``dir_fd``, following no
    symlink; ``create`` makes the missing ones (one ``mkdir`` relative to its parent each)."""
    if not names:
        return os.open(".", DIRECTORY_FLAGS, dir_fd=dir_fd)
    if _openat2_works(dir_fd):
        try:
            return _openat2(dir_fd, "/".join(names), DIRECTORY_FLAGS, 0)
        except FileNotFoundError:
            if not create:
                raise
    fd = os.dup(dir_fd)
    try:
        for name in names:
            try:
                child = _open_directory_component(fd, name)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                # Opened again with O_NOFOLLOW: whatever now has that name, a symlink swapped
                # in since the mkdir is refused like any other.
                child = _open_directory_component(fd, name)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_directory_component(dir_fd: int, name: str) -> int:
    """An fd of the directory ``name`` in ``dir_fd``, not followed if it is a symlink."""
    if _PATH_FLAG:
        # O_PATH | O_NOFOLLOW opens whatever the name is at that instant, a symlink included,
        # and fstat says what it was: the error names what was really there, with no second
        # look that a swap could fool.
        fd = os.open(name, _PATH_FLAG | os.O_NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind == stat.S_IFDIR:
            return fd
        os.close(fd)
        code = errno.ELOOP if kind == stat.S_IFLNK else errno.ENOTDIR
        raise OSError(code, os.strerror(code), name)
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
    except NotADirectoryError:
        # O_DIRECTORY | O_NOFOLLOW on a symlink says ENOTDIR. Looked at again only to word the
        # error, never to decide what to open.
        try:
            is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            is_link = False
        if is_link:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise
