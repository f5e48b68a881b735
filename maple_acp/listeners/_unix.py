"""The owner-only Unix socket listener: the endpoint the connector (``maple-acp acp``) reaches.

Binding follows the endpoint rules: the parent directory is private (created 0700, or an
existing one owned by this user with no group/other access); a symlink or a non-socket at the
path is never replaced; a socket that answers belongs to a live service and is left alone; a
socket that refuses connections is stale and removed. The new socket is bound under a temporary
name, set to 0600 and renamed into place, so it is never reachable with wider permissions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from pathlib import Path
from typing import Final

import attrs
import trio

from maple_acp._exceptions import MapleAcpError
from maple_acp.listeners._accept import AcceptRetry, RepeatReport
from maple_acp.listeners._shape import ConnectionHost
from maple_acp_connector.endpoint import UnsafeDirectory, ensure_private_dir

logger = logging.getLogger(__name__)

#: Listen backlog: the connection limit is enforced after accept, so a short queue suffices.
LISTEN_BACKLOG: Final = 16
#: How long a probe of an existing socket may take before it is judged not to answer.
PROBE_TIMEOUT_S: Final = 1.0


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
    probe.settimeout(PROBE_TIMEOUT_S)
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
        # The parents as ordinary directories; the socket's own directory private (0700).
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        ensure_private_dir(path.parent)
    except UnsafeDirectory as exc:
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


@attrs.frozen
class UnixListener:
    """The owner-only Unix socket at ``path`` (absolute), in the shape of every listener
    (:class:`~maple_acp.listeners.Listener`)."""

    path: Path

    async def serve(
        self,
        host: ConnectionHost,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on :attr:`path` and hand each admitted connection to ``host`` until
        cancelled; report the path (as a string) once clients can connect.

        Resource handling: the socket file is created on start and removed on exit (only if
        it is still ours); each connection's stream is closed when the host's
        ``serve_stream`` returns. Connections run in a nursery this method owns, so
        cancelling it ends every connection.

        Error handling: endpoint rule violations raise :class:`ListenerError` before
        ``task_status.started``. A connection the host has no slot for is closed at once.
        ``accept`` failing with EMFILE/ENFILE/ENOMEM/ENOBUFS is retried after a short pause
        (:class:`~maple_acp.listeners.AcceptRetry`); any other accept error propagates.
        Refusals and accept failures are each logged in one line at most once a minute, with
        a count.
        """
        path = self.path
        sock, identity = await trio.to_thread.run_sync(bind_endpoint, path)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        accepting = AcceptRetry("the Unix socket")
        refusals = RepeatReport(trio.current_time)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(os.fspath(path))
                while True:
                    stream = await accepting.accept(listener)
                    if not host.try_admit():
                        if count := refusals.note():
                            logger.warning(
                                "refusing an ACP connection on the Unix socket: every "
                                "connection slot is in use (%d refused in the last minute)",
                                count,
                            )
                        await stream.aclose()
                        continue
                    nursery.start_soon(_run_connection, host, stream)
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()
            remove_endpoint(path, identity)


async def _run_connection(host: ConnectionHost, stream: trio.SocketStream) -> None:
    try:
        async with stream:
            await host.serve_stream(stream)
    finally:
        host.release()
