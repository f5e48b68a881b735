"""The network listener: hypercorn's connection handling serving :class:`AcpNetworkApp`
behind our own accept loop (:mod:`maple_acp.net._tcp`: the connection cap, the first-request
deadline, calm accept errors), inside the caller's nursery (it starts and stops with the host's
ACP service). :class:`NetworkListener` gives it the shape of every listener
(``maple_acp.listeners.Listener``), beside the Unix socket's.

Streamable HTTP over HTTP/1.1 and HTTP/2 (h2c with prior knowledge or an upgrade on a plain
socket, ALPN with TLS), WebSocket over HTTP/1.1 (an HTTP/2 WebSocket, RFC 8441, is hypercorn's
and untested here).
A bind address other than loopback needs TLS: without ``tls_cert`` and ``tls_key`` the
listener refuses to start.
"""

from __future__ import annotations

import ipaddress
import logging
import stat
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from maple_acp.listeners import ConnectionHost
from maple_acp.net._app import AcpNetworkApp
from maple_acp.net._connections import NetworkHost, NetworkLimits
from maple_acp.net._errors import HttpSetupError
from maple_acp.net._guard import GuardPolicy, RequestGuard, is_loopback, origin_problem
from maple_acp.net._token import TokenFile
from maple_acp.rpc import MAX_LINE_BYTES, MAX_OUTBOUND_BYTES, MAX_OUTBOUND_LINES

logger = logging.getLogger(__name__)

#: What to install when hypercorn is missing (it is the ``http`` extra).
INSTALL_HINT: Final = (
    "install the network extra: pip install -e '.[http]' in a checkout of maple-acp, "
    "or pip install 'maple-acp[http]' from a package index"
)
#: Permission bits of a TLS key that let another account read or change it (0600 is right).
SHARED_KEY_BITS: Final = 0o077
#: An idle keep-alive connection (one that has sent a request) is closed after this: longer
#: than clients keep theirs pooled (httpx: 5 s, Node: 4 s), so a client never sends on a
#: connection the listener is closing. A first request has 5 s (``_tcp.FIRST_REQUEST_S``).
KEEP_ALIVE_S: Final = 30.0


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8765`` for IPv6) as a pair; ``ValueError`` names what is wrong."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}"[:200])
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the port in {value!r} is not a number"[:200]) from None
    if not 0 <= port <= 65535:
        raise ValueError(f"the port in {value!r} is out of range"[:200])
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"the host in {value!r} must be an IP address or localhost"[:200]
            ) from None
    return host, port


def refuse_shared_key(key: Path | None) -> None:
    """Refuse a TLS private key that accounts other than its owner may read or write: whoever
    reads it can pose as this listener to its clients (and read what they send)."""
    if key is None:
        return
    try:
        mode = key.stat().st_mode
    except OSError as exc:
        raise HttpSetupError(f"cannot read the TLS key {key}: {exc.strerror}") from None
    if mode & SHARED_KEY_BITS:
        raise HttpSetupError(
            f"refusing the TLS key {key}: other accounts can read or change it "
            f"(mode {stat.S_IMODE(mode):04o}); "
            f"run chmod 600 {key}"
        )


@attrs.frozen(kw_only=True)
class NetworkSettings:
    """Where and how the listener serves (``serve --http`` and the ``[http]`` config table)."""

    host: str
    port: int
    #: Where the bearer token file lives (``<data dir>/http-token``).
    data_dir: Path
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: Extra names the ``Host`` header may carry (a reverse proxy's public name).
    allowed_hosts: tuple[str, ...] = ()
    #: Browser origins allowed to call (none: no browser page may).
    allowed_origins: tuple[str, ...] = ()
    #: The connection's outbound credit window, and the inbound frame cap.
    keep_lines: int = MAX_OUTBOUND_LINES
    keep_bytes: int = MAX_OUTBOUND_BYTES
    max_message_bytes: int = MAX_LINE_BYTES

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def check(self) -> None:
        """Refuse what must not start, in one line (no token, no secret in it)."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise HttpSetupError("tls_cert and tls_key go together")
        if not self.tls and not is_loopback(self.host):
            raise HttpSetupError(
                f"refusing to serve HTTP on {self.host}, which is not a loopback address, "
                "without TLS: set tls_cert and tls_key (or bind 127.0.0.1 behind a proxy)"
            )
        for path in (self.tls_cert, self.tls_key):
            if path is not None and not path.is_file():
                raise HttpSetupError(f"the TLS file {path} does not exist")
        refuse_shared_key(self.tls_key)
        for entry in self.allowed_origins:
            problem = origin_problem(entry)
            if problem is not None:
                raise HttpSetupError(problem)

    def check_server_installed(self) -> None:
        _hypercorn_config(self)

    def url(self, port: int | None = None) -> str:
        scheme = "https" if self.tls else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port if port is None else port}/acp"


def _hypercorn_config(settings: NetworkSettings) -> Any:
    try:
        from hypercorn.config import Config
    except ImportError:
        raise HttpSetupError(f"serving ACP over HTTP needs hypercorn: {INSTALL_HINT}") from None
    # Both reach into hypercorn's protocol modules, so they load only once it is there.
    from maple_acp.net import _h2_flow
    from maple_acp.net._hypercorn_ws import configure_websocket

    _h2_flow.install()
    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    if settings.tls_cert is not None and settings.tls_key is not None:
        config.certfile = str(settings.tls_cert)
        config.keyfile = str(settings.tls_key)
    config.accesslog = None
    config.errorlog = logging.getLogger("maple_acp.net.server")
    config.include_server_header = False
    configure_websocket(config, settings.max_message_bytes)
    config.keep_alive_timeout = KEEP_ALIVE_S
    # Long-lived streams end with their connections, which the host ends first; nothing is
    # left to wait for by the time the listener stops.
    config.graceful_timeout = 0.5
    return config


async def serve_network(
    host: NetworkHost,
    settings: NetworkSettings,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ACP over WebSocket and Streamable HTTP at ``/acp`` until cancelled; report the
    URL it serves (with the bound port when ``settings.port`` was 0) once it listens.

    Resource handling: the listening socket and every network connection live in a nursery
    this function owns; cancelling it ends them all (the host's own stop ends the ACP
    connections first). The token file is created on first use (0600). At most
    ``_tcp.MAX_TCP_CONNECTIONS`` TCP connections are open at once, each closed unless it sends
    a complete request within ``_tcp.FIRST_REQUEST_S`` of its accept.

    Error handling: :class:`HttpSetupError` before anything listens for a setting that must
    not start (see :meth:`NetworkSettings.check`), a missing hypercorn or an unusable token
    file; ``OSError`` from binding propagates.
    """
    settings.check()
    config = _hypercorn_config(settings)
    from maple_acp.net._tcp import TcpWorker, open_file_limit

    token = TokenFile(settings.data_dir)
    guard = RequestGuard(
        GuardPolicy.for_bind(settings.host, settings.allowed_hosts, settings.allowed_origins),
        token.matches,
        trio.current_time,
    )
    limits = NetworkLimits(
        keep_lines=settings.keep_lines,
        keep_bytes=settings.keep_bytes,
        max_message_bytes=settings.max_message_bytes,
    )
    async with trio.open_nursery() as nursery:
        app = AcpNetworkApp(host, guard, nursery, limits, token)
        worker = TcpWorker(app, config, fd_limit=open_file_limit())
        binds = await nursery.start(worker.serve)
        port = settings.port
        if binds:
            port = int(str(binds[0]).rsplit(":", 1)[1])
        url = settings.url(port)
        logger.info("serving ACP over WebSocket and HTTP at %s", url)
        task_status.started(url)


@attrs.frozen
class NetworkListener:
    """ACP over WebSocket and Streamable HTTP with ``settings``, in the shape of every
    listener (``maple_acp.listeners.Listener``): a host starts it beside the Unix socket with
    ``await acp.listen(nursery, NetworkListener(settings))``, which returns the URL.

    Resource handling and error handling are :func:`serve_network`'s: a setting that must not
    start, a missing hypercorn or an unusable token file is an :class:`HttpSetupError`, and a
    bind that fails an ``OSError``, before anything listens.
    """

    settings: NetworkSettings

    async def serve(
        self,
        host: ConnectionHost,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled; report the URL (with the bound port) once it listens."""
        await serve_network(host, self.settings, task_status=task_status)
