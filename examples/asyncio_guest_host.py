"""A host whose main loop is asyncio (as a GUI toolkit's would be) running maple_acp in Trio
guest mode.

Trio runs *inside* the asyncio loop, on the same thread: ``trio.lowlevel.start_guest_run``
hands Trio's scheduler ticks to the host loop through ``loop.call_soon_threadsafe``. The host's
own code (here a tiny "status panel" that redraws when the counters change) reads the runtime
synchronously, because it runs on the same thread; to *do* something in Trio from the host
loop, it goes through the ``TrioToken`` (``token.run_sync_soon``).

A GUI toolkit works the same way: pass its "call this soon on the UI thread" function (Qt:
a queued signal or ``QMetaObject.invokeMethod``; Tk: ``root.after(0, ...)`` guarded by a
thread-safe queue) as ``run_sync_soon_threadsafe``.

Run::

    .venv/bin/python examples/asyncio_guest_host.py \
        --socket /tmp/demo/acp.sock --data-dir /tmp/demo/data

then point a connector at it (``maple-acp acp --socket /tmp/demo/acp.sock``). SIGINT or
SIGTERM stops it: the ACP service first, then the runtime, then the store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from maple_acp._groups import single_exception
from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.config import PrivateDirectoryError, make_private_dir
from maple_acp.edge import (
    AcpService,
    AcpServiceConfig,
    ConfigError,
    HostLifecycle,
    ListenerError,
)
from maple_acp.listeners import UnixListener
from maple_acp.runtime import AgentService
from maple_acp.store import SqliteTaskStore

logger = logging.getLogger("example.host")

#: How often the host's "status panel" looks at the counters.
PANEL_REFRESH_S = 0.1


@attrs.frozen
class TrioHandles:
    """What the Trio side hands to the host loop once the service listens."""

    runtime: AgentService
    acp: AcpService
    token: trio.lowlevel.TrioToken
    stop: trio.CancelScope


async def trio_host(socket_path: Path, data_dir: Path, ready: asyncio.Future[TrioHandles]) -> None:
    """The Trio half: store, runtime, ACP service; runs until ``handles.stop`` is cancelled."""
    store = await SqliteTaskStore.open(data_dir / "tasks.sqlite3")
    async with store:
        runtime = AgentService(
            store=store, backend=DemoBackend(), catalog=demo_catalog(), policy=demo_policy()
        )
        async with runtime:
            runtime.sign_in(getpass.getuser())
            acp = AcpService(runtime, AcpServiceConfig())
            lifecycle = HostLifecycle(runtime, acp)
            async with trio.open_nursery() as nursery:
                await acp.start(nursery, UnixListener(socket_path))
                with trio.CancelScope() as stop:
                    # Same thread as the asyncio loop: setting its future here is safe.
                    ready.set_result(
                        TrioHandles(runtime, acp, trio.lowlevel.current_trio_token(), stop)
                    )
                    await trio.sleep_forever()
                report = await lifecycle.shutdown()
                if not report.ok:
                    logger.error("shutdown: %s", report)
                nursery.cancel_scope.cancel()


async def host_main(socket_path: Path, data_dir: Path) -> int:
    """The host's own loop (asyncio here)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[TrioHandles] = loop.create_future()
    done: asyncio.Future[Any] = loop.create_future()
    trio.lowlevel.start_guest_run(
        trio_host,
        socket_path,
        data_dir,
        ready,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        done_callback=done.set_result,
    )
    stop_requested = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop_requested.set)

    await asyncio.wait({ready, done}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        # Trio ended before listening (the endpoint was refused, say): report why in one line.
        try:
            done.result().unwrap()
        except BaseException as exc:
            refusal = single_exception(exc)
            if not isinstance(refusal, ListenerError | ConfigError):
                raise
            print(f"example host: {refusal}", file=sys.stderr, flush=True)
        return 1
    handles = ready.result()
    print(f"example host: serving on {socket_path}", file=sys.stderr, flush=True)

    shown = None
    while not stop_requested.is_set():
        acp_status, runtime_status = handles.acp.status(), handles.runtime.status()
        panel = (acp_status.connections, acp_status.sessions, runtime_status.active_runs)
        if panel != shown:
            print(
                "example host: connections={} sessions={} active runs={}".format(*panel),
                file=sys.stderr,
                flush=True,
            )
            shown = panel
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_requested.wait(), PANEL_REFRESH_S)

    # Ask Trio, from the host loop, to stop; then wait for the guest run to finish.
    handles.token.run_sync_soon(handles.stop.cancel)
    outcome = await done
    outcome.unwrap()
    print("example host: stopped", file=sys.stderr, flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="maple_acp in Trio guest mode on asyncio")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--data-dir", required=True, type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        # Both directories hold private things (the socket, the conversations): every
        # directory created here is 0700, and an existing one that is not private is refused.
        make_private_dir(args.socket.absolute().parent, "socket directory")
        data_dir = make_private_dir(args.data_dir, "data directory")
    except PrivateDirectoryError as exc:
        print(f"example host: {exc}", file=sys.stderr)
        return 1
    return asyncio.run(host_main(args.socket.absolute(), data_dir))


if __name__ == "__main__":
    sys.exit(main())
