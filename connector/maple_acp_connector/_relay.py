"""Connect to the host's socket and move bytes between it and this process's stdin/stdout.

Two directions, each a *pump* that reads at most 64 KiB at a time and writes it all before
reading again:

- upstream, stdin -> socket, runs in a daemon thread; stdin's end of file becomes
  ``shutdown(SHUT_WR)`` on the socket, and the thread ends;
- downstream, socket -> stdout, runs in the main thread; when the host closes the connection the
  connector exits at once, whatever stdin is doing.

Two threads rather than one ``poll`` loop: each direction may block on its own writer (a client
that is slow to read stdout, a host that is slow to read the socket) without stalling the
other, no file descriptor we share with the client has to be switched to non-blocking mode, and
in the bench it moves bytes faster than a single-threaded poll loop doing the same splices.

On Linux, when both ends of a direction are pipes or sockets, the bytes go through a private
pipe with ``os.splice`` and never enter Python. The source is always polled for readability
first and then spliced with ``SPLICE_F_NONBLOCK``: a blocking splice from a socket holds the
pipe while it waits and can deadlock request/response traffic. Elsewhere (and for terminals
and regular files) plain ``os.readv`` into one reused 64 KiB buffer and ``os.write``.

Signals: SIGINT, SIGTERM, SIGHUP and SIGPIPE end the connector with status ``128 + signal``
and no traceback. They are blocked in the upstream thread so that the kernel always delivers
them to the main thread, where Python runs handlers. A write to a stdout nobody reads any more
ends it the same way as SIGPIPE (141).
"""

from __future__ import annotations

import _socket as socket
import _thread
import errno
import os
import select
import sys

from maple_acp_connector._hello import build_hello
from maple_acp_connector.endpoint import (
    ENDPOINT_ENV,
    EndpointError,
    EndpointUnavailable,
    UnsafeEndpoint,
    _display,
    _reason,
    _resolve,
    check_endpoint_socket,
    check_private_dir,
    config_file_socket,
)

# The C modules under socket, signal and threading: their Python wrappers pull in enum,
# functools, collections and selectors, which roughly doubles the connector's start-up.
TYPE_CHECKING = False  # typing.TYPE_CHECKING would import typing; see endpoint.py
if TYPE_CHECKING:
    import signal
    from collections.abc import Mapping
    from types import FrameType
else:
    import _signal as signal

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_HOST_CLOSED = 3
_SIGNAL_EXIT_BASE = 128

# Larger reads make os.read pay an mmap/munmap per call, and a default pipe holds 64 KiB.
CHUNK = 64 * 1024
# A host that does not accept within this is as good as absent for an ACP client.
CONNECT_TIMEOUT = 10.0

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE)
_POLLIN_ANY = select.POLLIN | select.POLLHUP | select.POLLERR
_POLLOUT_ANY = select.POLLOUT | select.POLLHUP | select.POLLERR


class _Stopped(BaseException):
    """Raised in the main thread by a stop signal's handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _WriteFailed(Exception):
    """The destination of a pump refused bytes (its reader is gone)."""


def say(line: str) -> None:
    """One diagnostic line on stderr (never stdout: it carries only the host's bytes)."""
    try:
        sys.stderr.write(f"maple-acp: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed by the client: nowhere left to tell.


def _wait(poller: select.poll) -> None:
    poller.poll()


def _write_all(fd: int, data: memoryview, wait_writable: select.poll) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            # The client handed us a non-blocking descriptor; wait instead of spinning.
            _wait(wait_writable)
            continue
        except OSError as exc:
            raise _WriteFailed(exc) from None
        data = data[written:]


def _copy_pump(src: int, dst: int) -> None:
    """Move bytes until ``src`` ends; raise :class:`_WriteFailed` if ``dst`` refuses them."""
    readable = select.poll()
    readable.register(src, _POLLIN_ANY)
    writable = select.poll()
    writable.register(dst, _POLLOUT_ANY)
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while True:
        _wait(readable)
        try:
            count = os.readv(src, [buffer])
        except BlockingIOError:
            continue
        except OSError:
            return  # a reset or a hung-up terminal ends the stream like an end of file
        if count == 0:
            return
        _write_all(dst, view[:count], writable)


def _splice_pump(src: int, dst: int) -> None:
    """:func:`_copy_pump` through a private pipe with ``os.splice`` (Linux only)."""
    readable = select.poll()
    readable.register(src, _POLLIN_ANY)
    writable = select.poll()
    writable.register(dst, _POLLOUT_ANY)
    pipe_out, pipe_in = os.pipe()
    try:
        while True:
            _wait(readable)
            try:
                count = os.splice(
                    src, pipe_in, CHUNK, flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
                )
            except BlockingIOError:
                continue
            except OSError:
                return
            if count == 0:
                return
            while count:
                try:
                    count -= os.splice(pipe_out, dst, count, flags=os.SPLICE_F_MOVE)
                except BlockingIOError:
                    _wait(writable)
                except OSError as exc:
                    raise _WriteFailed(exc) from None
    finally:
        os.close(pipe_out)
        os.close(pipe_in)


def _splices(fd: int) -> bool:
    """Whether ``os.splice`` can move bytes to or from ``fd``, which is one end of a pump."""
    if not hasattr(os, "splice"):
        return False
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    import stat

    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def pump(src: int, dst: int, *, use_splice: bool | None = None) -> None:
    """Move bytes from ``src`` to ``dst`` until ``src`` ends (``use_splice=None``: if possible).

    Error handling: a read error on ``src`` counts as its end; a write error on ``dst`` raises
    :class:`_WriteFailed`.
    """
    if use_splice is None:
        use_splice = _splices(src) and _splices(dst)
    if use_splice:
        _splice_pump(src, dst)
    else:
        _copy_pump(src, dst)


class _Upstream:
    """stdin -> socket in a daemon thread; records whether stdin reached its end."""

    def __init__(self, stdin: int, sock: socket.socket, use_splice: bool | None) -> None:
        self.stdin_ended = False
        self._stdin = stdin
        self._sock = sock
        self._use_splice = use_splice
        self._done = _thread.allocate_lock()

    def run(self) -> None:
        try:
            self._run()
        finally:
            self._done.release()

    def _run(self) -> None:
        try:
            pump(self._stdin, self._sock.fileno(), use_splice=self._use_splice)
        except _WriteFailed:
            return  # the host stopped reading; the main thread sees it close and reports.
        except BaseException:
            return  # a daemon thread must not print a traceback; the main thread reports
        # Set before the half-close: once the host sees our end of file it may close at once,
        # and the main thread must then already know that the client had finished.
        self.stdin_ended = True
        try:  # noqa: SIM105 - contextlib is a start-up cost the connector avoids
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def start(self) -> None:
        # The thread inherits this mask: stop signals then always reach the main thread,
        # the only one where Python can run their handlers.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        # Held from here until the thread ends (a plain lock may be released by any thread).
        self._done.acquire()
        try:
            # Like a daemon thread, a _thread thread is never waited for at exit.
            _thread.start_new_thread(self.run, ())
        except BaseException:
            self._done.release()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def release(self) -> None:
        """Let go of the socket once the main thread is done with it."""
        if self._done.locked():
            # The thread may still be blocked on stdin and would later write to the socket's
            # descriptor number: closing it could hand that number to an unrelated file.
            # Shut the connection down instead and leave the descriptor to process exit.
            try:  # noqa: SIM105 - contextlib is a start-up cost the connector avoids
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        else:
            self._sock.close()


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(path)
        sock.settimeout(None)
        _check_peer(sock, path)
    except EndpointError:
        sock.close()
        raise
    except TimeoutError:
        sock.close()
        raise EndpointUnavailable(
            path, f"the service did not accept within {CONNECT_TIMEOUT:g} s"
        ) from None
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            reason = "no socket there (is the host running?)"
        elif exc.errno == errno.ECONNREFUSED:
            reason = "connection refused (no service is listening; is the host running?)"
        else:
            reason = _reason(exc)
        raise EndpointUnavailable(path, reason) from None
    return sock


def _check_peer(sock: socket.socket, path: str) -> None:
    """On Linux, refuse a listener run by another user (the path may have changed since lstat)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return
    # struct ucred {pid_t pid; uid_t uid; gid_t gid;}: three native 32-bit integers.
    creds = sock.getsockopt(socket.SOL_SOCKET, peercred, 12)
    uid = int.from_bytes(creds[4:8], sys.byteorder)
    if uid != os.geteuid():
        raise UnsafeEndpoint(path, f"the process listening there runs as uid {uid}")


def _open_endpoint(cli_socket: str | None, env: Mapping[str, str]) -> tuple[str, socket.socket]:
    if not cli_socket and not env.get(ENDPOINT_ENV):
        # The same host `status` finds: the config file's socket comes after flag and variable.
        cli_socket = config_file_socket(env)
    path, private_dir = _resolve(cli_socket, env)
    if private_dir is not None:
        try:
            check_private_dir(private_dir)
        except FileNotFoundError:
            raise EndpointUnavailable(path, "no socket there (is the host running?)") from None
    check_endpoint_socket(path)
    return path, _connect(path)


def _send_hello(sock: socket.socket, env: Mapping[str, str]) -> bool:
    """Send the hello frame if one is configured; ``False`` if the host is already gone."""
    frame, notes = build_hello(env)
    for note in notes:
        say(note)
    if frame is None:
        return True
    try:
        # MSG_NOSIGNAL: a closed host is reported as such, not as our own SIGPIPE.
        sock.sendall(frame, getattr(socket, "MSG_NOSIGNAL", 0))
    except OSError:
        return False
    return True


def _relay(
    cli_socket: str | None,
    env: Mapping[str, str],
    stdin: int,
    stdout: int,
    use_splice: bool | None,
) -> int:
    try:
        path, sock = _open_endpoint(cli_socket, env)
    except EndpointError as exc:
        say(str(exc))
        return EXIT_UNAVAILABLE
    closed_message = f"the maple-acp service at {_display(path)} closed the connection"
    if not _send_hello(sock, env):
        sock.close()
        say(closed_message)
        return EXIT_HOST_CLOSED
    upstream = _Upstream(stdin, sock, use_splice)
    upstream.start()
    try:
        pump(sock.fileno(), stdout, use_splice=use_splice)
    except _WriteFailed:
        return _SIGNAL_EXIT_BASE + signal.SIGPIPE
    finally:
        upstream.release()
    if upstream.stdin_ended:
        return EXIT_OK
    say(closed_message)
    return EXIT_HOST_CLOSED


def run(
    cli_socket: str | None,
    *,
    env: Mapping[str, str] | None = None,
    stdin: int = 0,
    stdout: int = 1,
    use_splice: bool | None = None,
) -> int:
    """Relay between ``stdin``/``stdout`` and the endpoint; return the exit status.

    Resource handling: the splice pipes are closed before returning, and so is the socket unless
    the upstream thread is still blocked on stdin (the host ended first): then the connection is
    shut down and its descriptor is left to process exit, like the thread itself.

    Error handling: an unavailable or unsafe endpoint is one line on stderr and status 1; the
    host closing while stdin is still open is one line and status 3; stop signals give
    ``128 + signal``. Nothing is ever written to stdout but the host's bytes.
    """
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stopping:
            raise _Stopped(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in _STOP_SIGNALS}
    try:
        status = _relay(cli_socket, os.environ if env is None else env, stdin, stdout, use_splice)
        stopping = True
    except _Stopped as stop:
        stopping = True
        status = _SIGNAL_EXIT_BASE + stop.signum
    finally:
        stopping = True
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status
