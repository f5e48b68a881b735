"""The owner-only Unix socket endpoint and its accept loop.

Binding follows the endpoint rules: the parent directory is private (created 0700, or an
existing one owned by this user with no group/other access); a symlink or a non-socket at the
path is never replaced; a socket that answers belongs to a live service and is left alone; a
socket that refuses connections is stale and removed. The new socket is bound under a temporary
name, set to 0600 and renamed into place, so it is never reachable with wider permissions.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import attrs
import trio

from maple_acp._exceptions import MapleAcpError
from maple_acp.edge._config import ConfigError, ensure_owner_only_dir

logger = logging.getLogger(__name__)

#: Listen backlog: the connection limit is enforced after accept, so a short queue suffices.
LISTEN_BACKLOG: Final = 16
#: accept() failures that mean "out of a resource for now": log, pause, retry (as trio does).
_TRANSIENT_ACCEPT_ERRNOS: Final = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
)
#: How long to pause after a transient accept failure before trying again.
ACCEPT_RETRY_SECONDS: Final = 0.1
#: A repeated trouble (accept failing, connections refused) is logged at most once in this:
#: a flood must not flood the log too.
REPORT_WINDOW_SECONDS: Final = 60.0
#: How long a probe of an existing socket may take before it is judged not to answer.
PROBE_TIMEOUT_SECONDS: Final = 1.0


class ListenerError(MapleAcpError):
    """The service cannot listen on the endpoint (one line, safe to show). Not the
    connector's ``ListenerError``, which is about reaching a service."""


class EndpointInUse(ListenerError):
    """Another service already answers on the endpoint."""


@attrs.frozen
class _SocketIdentity:
    device: int
    inode: int


def _probe_live(path: Path) -> bool:
    """True if something accepts connections on the socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_SECONDS)
    try:
        probe.connect(os.fspath(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        # A timeout or a permission error means something is there that we cannot judge;
        # refusing to start is the safe answer.
        raise ListenerError(
            f"cannot probe the existing socket at {path}: {exc.strerror or exc}"
        ) from exc
    finally:
        probe.close()
    return True


def _clear_stale(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise ListenerError(f"refusing to replace a symlink at {path}")
    if not stat.S_ISSOCK(info.st_mode):
        raise ListenerError(f"refusing to replace a non-socket at {path}")
    if _probe_live(path):
        raise EndpointInUse(f"another service is already listening at {path}")
    logger.info("removing stale socket %s", path)
    os.unlink(path)


def bind_endpoint(path: Path) -> tuple[socket.socket, _SocketIdentity]:
    """Create the listening socket at ``path`` following the endpoint rules (blocking)."""
    if not path.is_absolute():
        raise ListenerError("the socket path must be absolute")
    try:
        ensure_owner_only_dir(path.parent)
    except ConfigError as exc:
        raise ListenerError(str(exc)) from exc
    _clear_stale(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.bind")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(os.fspath(tmp))
        except OSError as exc:
            raise ListenerError(f"cannot bind {path}: {exc.strerror or exc}") from exc
        os.chmod(tmp, 0o600)
        # rename() would silently replace a socket bound by a racing service; link() refuses.
        try:
            os.link(tmp, path)
        except FileExistsError as exc:
            raise EndpointInUse(f"another service is already listening at {path}") from exc
        finally:
            os.unlink(tmp)
        sock.listen(LISTEN_BACKLOG)
        info = os.lstat(path)
    except BaseException:
        sock.close()
        raise
    return sock, _SocketIdentity(info.st_dev, info.st_ino)


def remove_endpoint(path: Path, identity: _SocketIdentity) -> None:
    """Remove the socket file only if it is still the one we bound."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) == (identity.device, identity.inode):
        os.unlink(path)


ConnectionHandler = Callable[[trio.SocketStream], Awaitable[None]]


class RepeatReport:
    """When to log a trouble that repeats (sans-I/O): its first time, then at most once a
    window, with how many times it happened since it was last logged."""

    def __init__(self, clock: Callable[[], float], window_s: float = REPORT_WINDOW_SECONDS) -> None:
        self._clock = clock
        self._window_s = window_s
        self._told_at = -math.inf
        self._count = 0

    def note(self) -> int:
        """Count one; the count to log now (this one included), or 0 to stay quiet."""
        self._count += 1
        now = self._clock()
        if now - self._told_at < self._window_s:
            return 0
        count, self._count, self._told_at = self._count, 0, now
        return count


class ConnectionGate:
    """Counts live connections against the configured maximum (sans-I/O)."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.active = 0

    def try_admit(self) -> bool:
        if self.active >= self.maximum:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1


async def serve_endpoint(
    path: Path,
    handler: ConnectionHandler,
    gate: ConnectionGate,
    *,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``path`` and run ``handler`` for each admitted connection until cancelled.

    Resource handling: the socket file is created on start and removed on exit (only if it is
    still ours); each connection's stream is closed when its handler returns. Handlers run in a
    nursery this function owns, so cancelling it ends every connection.

    Error handling: endpoint rule violations raise :class:`ListenerError` before
    ``task_status.started``. A connection beyond the gate's maximum is closed at once.
    ``accept`` failing with EMFILE/ENFILE/ENOMEM/ENOBUFS is retried after a short pause; any
    other accept error propagates. Refusals and accept failures are each logged in one line
    at most once a minute, with a count.
    """
    sock, identity = await trio.to_thread.run_sync(bind_endpoint, path)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    accept_failures = RepeatReport(trio.current_time)
    refusals = RepeatReport(trio.current_time)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started(path)
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _TRANSIENT_ACCEPT_ERRNOS:
                        raise
                    if count := accept_failures.note():
                        code = exc.errno or 0
                        logger.warning(
                            "accept failed on the socket (%s: %s) %d time%s in the last "
                            "minute; retrying every %.1f s",
                            errno.errorcode.get(code, code),
                            os.strerror(code),
                            count,
                            "" if count == 1 else "s",
                            ACCEPT_RETRY_SECONDS,
                        )
                    await trio.sleep(ACCEPT_RETRY_SECONDS)
                    continue
                if not gate.try_admit():
                    if count := refusals.note():
                        logger.warning(
                            "refusing an ACP connection: %d of %d connections in use "
                            "(%d refused in the last minute)",
                            gate.active,
                            gate.maximum,
                            count,
                        )
                    await stream.aclose()
                    continue
                nursery.start_soon(_run_connection, handler, stream, gate)
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        remove_endpoint(path, identity)


async def _run_connection(
    handler: ConnectionHandler, stream: trio.SocketStream, gate: ConnectionGate
) -> None:
    try:
        async with stream:
            await handler(stream)
    finally:
        gate.release()
