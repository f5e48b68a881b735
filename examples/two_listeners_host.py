"""A host serving ACP on both listeners: the owner-only Unix socket the connector reaches, and
the network (WebSocket and Streamable HTTP at ``/acp``), side by side in one connection limit,
until SIGINT or SIGTERM.

Run (the network listener needs the ``http`` extra)::

    .venv/bin/python examples/two_listeners_host.py \
        --socket /tmp/demo/acp.sock --data-dir /tmp/demo/data --http 127.0.0.1:8765

It writes one line on stderr once both listen, naming the socket, the URL and the token file
(``<data dir>/http-token``, created 0600 on first use). Point the connector at the socket
(``maple-acp acp --socket /tmp/demo/acp.sock``), or a network client at the URL with
``Authorization: Bearer`` and the token. SIGINT or SIGTERM stops it: both listeners and every
connection first, then the runtime, then the store. A refused endpoint or setting (a shared
socket directory, a live service on the socket, an address other than loopback without TLS, a
port in use) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import signal
import sys
from pathlib import Path
from typing import TypeVar

import trio

from maple_acp import harden_host_process
from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.config import PrivateDirectoryError, make_private_dir
from maple_acp.edge import AcpService, AcpServiceConfig, HostLifecycle
from maple_acp.listeners import ListenerError, UnixListener
from maple_acp.net import HttpSetupError, NetworkListener, NetworkSettings, parse_listen, token_path
from maple_acp.runtime import AgentService
from maple_acp.store import SqliteTaskStore

logger = logging.getLogger("example.host")

E = TypeVar("E", bound=BaseException)


async def main(socket_path: Path, data_dir: Path, host: str, port: int) -> None:
    store = await SqliteTaskStore.open(data_dir / "tasks.sqlite3")
    async with store:
        runtime = AgentService(
            store=store, backend=DemoBackend(), catalog=demo_catalog(), policy=demo_policy()
        )
        async with runtime:
            runtime.sign_in(getpass.getuser())
            acp = AcpService(runtime, AcpServiceConfig())
            lifecycle = HostLifecycle(runtime, acp)
            # Loopback without TLS; another address needs tls_cert and tls_key.
            network = NetworkSettings(host=host, port=port, data_dir=data_dir)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    # Each returns once clients can connect, with where they connect.
                    socket = await acp.listen(nursery, UnixListener(socket_path))
                    url = await acp.listen(nursery, NetworkListener(network))
                    token = token_path(data_dir)
                    say(f"serving on {socket} and {url} (token in {token})")
                    try:
                        async for _ in signals:  # the host's real work goes here
                            break
                    finally:
                        with trio.CancelScope(shield=True):
                            # Both listeners and their connections first, then the runtime.
                            report = await lifecycle.shutdown()
                        if not report.ok:
                            logger.error("shutdown: %s", report)
                        nursery.cancel_scope.cancel()


def say(line: str) -> None:
    print(f"example host: {line}", file=sys.stderr, flush=True)


def first(group: BaseExceptionGroup[E]) -> E:
    """The first exception a (nested) group holds: Trio's nurseries each add a level."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found  # type: ignore[return-value]


def run() -> int:
    parser = argparse.ArgumentParser(description="maple_acp on the Unix socket and the network")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--http", default="127.0.0.1:8765", metavar="HOST:PORT")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # First of all: the processes the host starts (the model's shell) run as the same user.
    harden_host_process()
    try:
        host, port = parse_listen(args.http)
        # Both directories hold private things (the socket, the conversations, the token).
        make_private_dir(args.socket.absolute().parent, "socket directory")
        data_dir = make_private_dir(args.data_dir, "data directory")
    except (ValueError, PrivateDirectoryError) as exc:
        say(str(exc))
        return 1
    refusal = None
    try:
        trio.run(main, args.socket.absolute(), data_dir, host, port)
    except* (ListenerError, HttpSetupError) as refused:
        refusal = str(first(refused))
    except* OSError as failed:
        refusal = f"cannot listen on {args.http}: {first(failed).strerror}"
    say(refusal or "stopped")
    return 0 if refusal is None else 1


if __name__ == "__main__":
    sys.exit(run())
