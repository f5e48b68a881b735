"""The data directory's lock: one host at a time on a store file.

Two hosts on one store would each believe they own it: the second host's start-up sweep deletes
the first host's provisional tasks (sessions a client just opened), and both would sweep and
checkpoint under each other. ``DataDirectoryLock`` makes the store file exclusive to one
process for as long as it is open: an ``flock`` on a lock file beside the store file, with the
holder's PID written into it so that a refused host can say who holds the directory.

Resource handling: ``acquire`` opens the lock file (created owner-only, 0600), takes the lock
and writes this process's PID; ``release`` closes the descriptor, which releases the lock. The
file itself is never removed: unlinking a lock file while another process may have it open is
how two processes end up "holding" two different files. A holder that died leaves its file
behind, unlocked (the kernel drops an ``flock`` with the last descriptor), so the next host
takes it and writes its own PID over the old one. The descriptor is close-on-exec, so a tool
child the host starts never inherits it and never keeps the directory locked after the host
ended.

Error handling: a lock held by another open (another process, or another store object on the
same file in this process: ``flock`` locks belong to an open file description) is
``DataDirectoryLocked``, with the holder's PID when the file names one; any other failure to
open or lock the file is ``StoreError``. Both without leaking the descriptor.

Cancellation: the calls are short, blocking and never wait (``LOCK_NB``); the store runs them
on its worker thread like every other file operation.
"""

from __future__ import annotations

import fcntl
import os

from maple_acp.store._protocol import StoreError

__all__ = ["LOCK_SUFFIX", "DataDirectoryLock", "DataDirectoryLocked", "check_data_directory_free"]

#: The lock file is the store file's name plus this: it sits beside the file it guards.
LOCK_SUFFIX = ".lock"
#: A PID is at most a few digits; anything longer in the lock file is not one.
_MAX_PID_BYTES = 32


class DataDirectoryLocked(StoreError):
    """Another host (another open of the same store file) holds the data directory."""

    def __init__(self, directory: str, holder_pid: int | None) -> None:
        self.directory = directory
        self.holder_pid = holder_pid
        holder = f"PID {holder_pid}" if holder_pid is not None else "a process of unknown PID"
        super().__init__(f"the data directory {directory} is in use by another host ({holder})")


class DataDirectoryLock:
    """The held lock of one store file's directory (see the module docstring)."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd: int | None = fd
        #: The lock file's path.
        self.path = path

    @classmethod
    def acquire(cls, store_path: str) -> DataDirectoryLock:
        """Lock the directory of ``store_path`` for this process, or raise
        ``DataDirectoryLocked`` naming the directory and the holder's PID."""
        lock_path = store_path + LOCK_SUFFIX
        try:
            # O_NOFOLLOW: a symlink planted in place of the lock file is refused, not followed.
            fd = os.open(
                lock_path,
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                0o600,
            )
        except OSError as exc:
            raise StoreError(f"cannot open the data directory lock ({type(exc).__name__})") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                directory = os.path.dirname(os.path.abspath(store_path))
                raise DataDirectoryLocked(directory, _read_pid(fd)) from None
            # Written in place, then cut to length: a reader never sees an empty file where a
            # (possibly older) PID was before.
            pid = f"{os.getpid()}\n".encode()
            os.pwrite(fd, pid, 0)
            os.ftruncate(fd, len(pid))
        except DataDirectoryLocked:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock the data directory ({type(exc).__name__})") from exc
        return cls(fd, lock_path)

    def release(self) -> None:
        """Release the lock (closing its descriptor). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def check_data_directory_free(store_path: str) -> None:
    """Raise ``DataDirectoryLocked`` (naming the holder) if a host holds the directory of
    ``store_path``, ``StoreError`` if the lock cannot be tried; else return, holding nothing:
    the lock is taken and released at once, so a host starting meanwhile is never refused
    for longer than the attempt."""
    DataDirectoryLock.acquire(store_path).release()


def _read_pid(fd: int) -> int | None:
    """The PID the holder wrote, ``None`` if the file does not (yet) name one."""
    try:
        text = os.pread(fd, _MAX_PID_BYTES, 0)
    except OSError:
        return None
    try:
        pid = int(text.strip())
    except ValueError:
        return None
    return pid if pid > 0 else None
