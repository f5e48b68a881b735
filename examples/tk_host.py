"""A desktop host you can see: a Tk window running maple_acp in Trio guest mode.

Trio runs *inside* Tk's event loop, on the same thread: ``trio.lowlevel.start_guest_run``
hands Trio's scheduler ticks to Tk through ``TkGuestLoop.run_sync_soon_threadsafe`` (a queue
of callables, and a Tcl ``after 0`` that runs the next one; Tcl hands a call made from Trio's
I/O thread to the thread running Tk's loop). The window shows the ACP service (serving or
stopped, and its socket path) with Start and Stop buttons, the live connections, the held
sessions and what each is doing, and a log pane fed by a ``logging`` handler.

The window reads the runtime and the service synchronously (``AcpService.status()`` and
``connections()``, ``AgentService.held_tasks()``): its callbacks run between Trio's ticks, on
Trio's thread. It redraws only what changed, four times a second. To *do* something in Trio
(start or stop the service, quit), a button posts a command through the ``TrioToken``; one
Trio task carries the commands out in order.

Run::

    .venv/bin/python examples/tk_host.py --socket /tmp/demo/acp.sock --data-dir /tmp/demo/data

then point a connector at it (``maple-acp acp --socket /tmp/demo/acp.sock``). Closing the window,
SIGINT or SIGTERM stops it: the ACP service first, then the runtime, then the store; the
window goes away once Trio's run has ended.

Debug hook (for tests): with ``--debug-shown`` the host writes one line to stderr each time the
window redraws, ``tk host: shown {json}``, holding what the widgets show, read back from the
widgets: ``service`` and ``socket`` (the two labels), ``start`` and ``stop`` (whether each
button is enabled), ``connections`` (rows of number, sessions, active runs), ``sessions`` (rows
of session id, project, title, mode, state) and ``log`` (the pane's last lines). Besides, the
lines ``tk host: serving on <path>``, ``tk host: window <X window id>`` and ``tk host:
stopped`` mark its life on stderr. ``--debug-shown`` also reads stdin: a line ``press start``
or ``press stop`` invokes that button, as a click would.
"""

from __future__ import annotations

import argparse
import enum
import getpass
import json
import logging
import os
import queue
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs
import outcome
import trio

try:
    import tkinter as tk
    from tkinter import ttk
except ImportError as exc:  # a Python built without Tk
    sys.exit(
        f"tk host: Tk is not available to this Python ({exc}); on Debian or Ubuntu: "
        "apt install python3-tk"
    )

from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.config import PrivateDirectoryError, make_private_dir
from maple_acp.edge import (
    AcpService,
    AcpServiceConfig,
    ConfigError,
    ConnectionView,
    HostLifecycle,
    ListenerError,
)
from maple_acp.listeners import UnixListener
from maple_acp.runtime import AgentService, HeldTask
from maple_acp.store import SqliteTaskStore, StoreError

logger = logging.getLogger("example.tk_host")

#: How often the window looks at the service and the runtime: quick enough to look live,
#: and each look is a few synchronous reads; nothing is redrawn unless it changed.
REFRESH_MS: Final = 250
#: Lines the log pane keeps: a window left open for days must not grow without end.
MAX_LOG_LINES: Final = 500
#: Log records waiting for the next refresh, at most (more are dropped and counted).
MAX_PENDING_RECORDS: Final = 1000
#: Lines of the log pane the debug hook reports.
SHOWN_LOG_LINES: Final = 20
#: Commands waiting for the Trio side: the buttons are disabled while one is carried out.
MAX_PENDING_COMMANDS: Final = 8
#: A session id column this many pixels wide shows a whole id (32 hex digits).
SESSION_ID_PX: Final = 270


class Command(enum.Enum):
    START = "start"
    STOP = "stop"
    QUIT = "quit"


def say(line: str) -> None:
    """One line of the host's own life on stderr (not a log record: a test reads these)."""
    print(f"tk host: {line}", file=sys.stderr, flush=True)


class TkGuestLoop:
    """Trio's ticks on Tk's event loop.

    ``run_sync_soon_threadsafe`` queues the callable and asks Tcl to run one queued callable
    after 0 ms. Trio calls it from its I/O thread too: tkinter hands such a call to the thread
    running Tk's loop (Tcl is built threaded), so the queue is drained on that thread only.
    """

    def __init__(self, root: tk.Tk) -> None:
        self._root = root
        self._pending: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._run_next_command = root.register(self._run_next)

    def _run_next(self) -> None:
        self._pending.get_nowait()()

    def run_sync_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        self._pending.put(fn)
        self._root.tk.call("after", 0, self._run_next_command)


class PaneHandler(logging.Handler):
    """Keeps formatted log records for the window's log pane. Records may come from any thread
    (the store's worker threads log too): they wait in a bounded queue for the next refresh."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        self._lines: queue.Queue[str] = queue.Queue(MAX_PENDING_RECORDS)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.put_nowait(self.format(record))
        except queue.Full:
            self.dropped += 1
        except Exception:
            self.handleError(record)

    def take(self) -> list[str]:
        """The lines waiting, and a note of how many were dropped since the last take."""
        lines: list[str] = []
        while True:
            try:
                lines.append(self._lines.get_nowait())
            except queue.Empty:
                break
        dropped, self.dropped = self.dropped, 0
        if dropped:
            lines.append(f"({dropped} log lines dropped: they came faster than the window draws)")
        return lines


@attrs.frozen
class TrioSide:
    """What the Trio side hands the window once the runtime serves."""

    runtime: AgentService
    acp: AcpService
    token: trio.lowlevel.TrioToken
    commands: trio.MemorySendChannel[Command]


class HostWindow:
    """The window: service state and buttons, connections, sessions, the log pane."""

    def __init__(self, root: tk.Tk, socket_path: Path, pane: PaneHandler, *, debug: bool) -> None:
        self.root = root
        self.socket_path = socket_path
        self.pane = pane
        self.debug = debug
        self.trio: TrioSide | None = None
        #: What the Trio side is doing for a command (the buttons wait), or ``None``.
        self.busy: str | None = "starting…"
        #: Why the last start was refused, or ``None``.
        self.refused: str | None = None
        #: The window was closed: the host is shutting down.
        self._quitting = False
        self._drawn: Any = None
        self._shown: dict[str, Any] | None = None

        root.title("maple_acp host")
        root.geometry("760x520+0+0")
        frame = ttk.Frame(root, padding=8)
        frame.pack(fill="both", expand=True)

        top = ttk.Frame(frame)
        top.pack(fill="x")
        self.service_label = ttk.Label(top, text="", width=60)
        self.service_label.pack(side="left")
        self.stop_button = ttk.Button(top, text="Stop", command=self.on_stop)
        self.stop_button.pack(side="right")
        self.start_button = ttk.Button(top, text="Start", command=self.on_start)
        self.start_button.pack(side="right")
        self.socket_label = ttk.Label(frame, text=f"Socket: {socket_path}")
        self.socket_label.pack(fill="x", pady=(4, 8))

        ttk.Label(frame, text="Connections").pack(anchor="w")
        self.connections = self._table(frame, ("#", "sessions", "runs"), (40, 600, 60), 3)
        ttk.Label(frame, text="Sessions").pack(anchor="w", pady=(8, 0))
        self.sessions = self._table(
            frame,
            ("session", "project", "title", "mode", "state"),
            (SESSION_ID_PX, 180, 140, 60, 70),
            4,
        )
        ttk.Label(frame, text="Log").pack(anchor="w", pady=(8, 0))
        self.log = tk.Text(frame, height=8, wrap="none", state="disabled")
        self.log.pack(fill="both", expand=True)

        root.protocol("WM_DELETE_WINDOW", self.on_close)

    @staticmethod
    def _table(
        parent: ttk.Frame, columns: tuple[str, ...], widths: tuple[int, ...], height: int
    ) -> ttk.Treeview:
        table = ttk.Treeview(parent, columns=columns, show="headings", height=height)
        for column, width in zip(columns, widths, strict=True):
            table.heading(column, text=column.capitalize())
            table.column(column, width=width, stretch=column in ("sessions", "title"))
        table.pack(fill="x")
        return table

    # -- commands (to Trio) --------------------------------------------------------------------

    def _send(self, command: Command) -> None:
        side = self.trio
        if side is None:
            return  # Trio has not served yet, or is ending: nothing to ask

        def send() -> None:
            # Runs in Trio (the token's callbacks run there); it must not raise.
            try:
                side.commands.send_nowait(command)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                logger.warning("the host is busy; %s was not carried out", command.value)

        # Not a Trio task: go through the token.
        side.token.run_sync_soon(send)
        self.refresh_now()

    def _post(self, command: Command, busy: str) -> None:
        if self.busy is not None:
            return  # the buttons are disabled until the last command is carried out
        self.busy = busy
        self._send(command)

    def on_start(self) -> None:
        self._post(Command.START, "starting…")

    def on_stop(self) -> None:
        self._post(Command.STOP, "stopping…")

    def on_close(self) -> None:
        if self.trio is None or self._quitting:
            return  # the window goes once Trio's run has ended
        self._quitting = True
        self.busy = "shutting down…"
        self._send(Command.QUIT)

    def command_done(self, *, refused: str | None = None) -> None:
        """From the Trio side, on this thread: the command was carried out (a start was
        refused, saying why)."""
        if not self._quitting:
            self.busy = None
        self.refused = refused
        self.refresh_now()

    def press(self, name: str) -> None:
        """The debug hook's ``press <button>``: what a click does."""
        button = {"start": self.start_button, "stop": self.stop_button}.get(name)
        if button is None:
            logger.warning("debug hook: no button %r", name[:20])
        else:
            button.invoke()

    # -- drawing -------------------------------------------------------------------------------

    def schedule_refresh(self) -> None:
        self.refresh_now()
        self.root.after(REFRESH_MS, self.schedule_refresh)

    def refresh_now(self) -> None:
        lines = self.pane.take()
        if lines:
            self._append_log(lines)
        side = self.trio
        if side is None:
            state: Any = (self.busy, self.refused, None, (), ())
        else:
            acp = side.acp.status()
            state = (
                self.busy,
                self.refused,
                acp.endpoint,
                side.acp.connections(),
                side.runtime.held_tasks(),
            )
        if state != self._drawn:
            self._draw(*state)
            self._drawn = state
        if self.debug:
            shown = self.shown()
            if shown != self._shown:
                say("shown " + json.dumps(shown))
                self._shown = shown

    def _draw(
        self,
        busy: str | None,
        refused: str | None,
        endpoint: str | None,
        connections: tuple[ConnectionView, ...],
        sessions: tuple[HeldTask, ...],
    ) -> None:
        if busy is not None:
            service = busy
        elif endpoint is not None:
            service = "serving"
        elif refused is not None:
            service = f"not started: {refused}"
        else:
            service = "stopped"
        self.service_label.configure(text=f"Service: {service}")
        self.socket_label.configure(text=f"Socket: {endpoint or self.socket_path}")
        idle = busy is None
        self.start_button.state(["!disabled" if idle and endpoint is None else "disabled"])
        self.stop_button.state(["!disabled" if idle and endpoint is not None else "disabled"])
        _fill(
            self.connections,
            [
                (view.number, " ".join(view.session_ids) or "—", view.active_runs)
                for view in connections
            ],
        )
        _fill(
            self.sessions,
            [
                (
                    held.task.id,
                    held.task.root,
                    held.task.title or "—",
                    held.mode,
                    held.state.value,
                )
                for held in sessions
            ],
        )

    def _append_log(self, lines: list[str]) -> None:
        self.log.configure(state="normal")
        self.log.insert("end", "".join(line + "\n" for line in lines))
        # Keep the last MAX_LOG_LINES lines (the text always ends with an empty line).
        excess = int(self.log.index("end-1c").split(".")[0]) - 1 - MAX_LOG_LINES
        if excess > 0:
            self.log.delete("1.0", f"{excess + 1}.0")
        self.log.configure(state="disabled")
        self.log.see("end")

    def shown(self) -> dict[str, Any]:
        """What the widgets show, read back from them (the debug hook's line)."""
        log_lines = self.log.get("1.0", "end-1c").splitlines()
        return {
            "service": str(self.service_label.cget("text")),
            "socket": str(self.socket_label.cget("text")),
            "start": not self.start_button.instate(["disabled"]),
            "stop": not self.stop_button.instate(["disabled"]),
            "connections": _rows(self.connections),
            "sessions": _rows(self.sessions),
            "log": log_lines[-SHOWN_LOG_LINES:],
        }


def _fill(table: ttk.Treeview, rows: list[tuple[object, ...]]) -> None:
    table.delete(*table.get_children())
    for row in rows:
        table.insert("", "end", values=[str(value) for value in row])


def _rows(table: ttk.Treeview) -> list[list[str]]:
    return [[str(value) for value in table.item(item, "values")] for item in table.get_children()]


# -- the Trio side ---------------------------------------------------------------------------


async def start_service(
    acp: AcpService, nursery: trio.Nursery, socket_path: Path, window: HostWindow
) -> None:
    try:
        endpoint = await acp.start(nursery, UnixListener(socket_path))
    except (ListenerError, ConfigError) as reason:
        logger.error("the ACP service did not start: %s", reason)
        window.command_done(refused=str(reason))
        return
    say(f"serving on {endpoint}")
    window.command_done()


async def watch_signals(commands: trio.MemorySendChannel[Command]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            await commands.send(Command.QUIT)
            return


async def trio_host(socket_path: Path, data_dir: Path, window: HostWindow) -> None:
    """The Trio half: store, runtime, ACP service; carries out the window's commands until
    it asks to quit (or a signal does), then shuts down in order.

    Resource handling: the store, the runtime and the listener end before this returns; the
    socket file is removed. Error handling: a refused endpoint is shown and logged, and the
    host keeps running stopped (Start tries again); anything else ends the run, and the
    window with it.
    """
    store = await SqliteTaskStore.open(data_dir / "tasks.sqlite3")
    async with store:
        runtime = AgentService(
            store=store, backend=DemoBackend(), catalog=demo_catalog(), policy=demo_policy()
        )
        async with runtime:
            runtime.sign_in(getpass.getuser())
            acp = AcpService(runtime, AcpServiceConfig())
            lifecycle = HostLifecycle(runtime, acp)
            send, receive = trio.open_memory_channel[Command](MAX_PENDING_COMMANDS)
            async with trio.open_nursery() as nursery:
                # Same thread as Tk: handing the window its side here is safe.
                window.trio = TrioSide(runtime, acp, trio.lowlevel.current_trio_token(), send)
                nursery.start_soon(watch_signals, send)
                await start_service(acp, nursery, socket_path, window)
                async for command in receive:
                    if command is Command.QUIT:
                        break
                    if command is Command.START:
                        await start_service(acp, nursery, socket_path, window)
                    else:
                        await acp.stop()
                        logger.info("the ACP service stopped")
                        window.command_done()
                report = await lifecycle.shutdown()
                if not report.ok:
                    logger.error("shutdown: %s", report)
                window.trio = None
                nursery.cancel_scope.cancel()


def read_debug_commands(root: tk.Tk, window: HostWindow) -> None:
    """The debug hook's stdin: ``press start`` / ``press stop`` lines, read when Tk sees
    input waiting (no thread, no polling)."""

    def readable(fd: int, _mask: int) -> None:
        data = os.read(fd, 4096)
        if not data:
            root.deletefilehandler(fd)
            return
        for line in data.decode(errors="replace").splitlines():
            verb, _, name = line.strip().partition(" ")
            if verb == "press":
                window.press(name)

    root.createfilehandler(sys.stdin.fileno(), tk.READABLE, readable)


def run_window(socket_path: Path, data_dir: Path, *, debug: bool) -> int:
    """Tk's loop with Trio as its guest; returns once both have ended."""
    try:
        root = tk.Tk()
    except tk.TclError as exc:  # no display
        say(f"cannot open a window: {exc}")
        return 1
    pane = PaneHandler()
    logging.getLogger().addHandler(pane)
    window = HostWindow(root, socket_path, pane, debug=debug)
    ended: list[outcome.Outcome[None]] = []

    def done(result: outcome.Outcome[None]) -> None:
        # Trio's run is over: the service stopped, the runtime drained, the store closed.
        ended.append(result)
        root.destroy()

    def begin() -> None:
        say(f"window {root.winfo_id():#x}")
        trio.lowlevel.start_guest_run(
            trio_host,
            socket_path,
            data_dir,
            window,
            run_sync_soon_threadsafe=TkGuestLoop(root).run_sync_soon_threadsafe,
            done_callback=done,
        )
        window.schedule_refresh()
        if debug:
            read_debug_commands(root, window)

    # Start Trio from inside Tk's loop: Trio's I/O thread needs the loop running to be heard.
    root.after_idle(begin)
    root.mainloop()
    logging.getLogger().removeHandler(pane)
    if not ended:
        say("the window went away before the service stopped")
        return 1
    try:
        ended[0].unwrap()
    except StoreError as exc:  # the data directory is another host's, say
        say(str(exc))
        return 1
    say("stopped")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="maple_acp in Trio guest mode on Tk")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument(
        "--debug-shown",
        action="store_true",
        help="write what the window shows to stderr at each redraw; read 'press <button>' lines",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # The window's pane shows the service's INFO lines; stderr keeps warnings and errors.
    logging.getLogger().handlers[0].setLevel(logging.WARNING)
    logging.getLogger().setLevel(logging.INFO)
    try:
        # Both directories hold private things (the socket, the conversations): every
        # directory created here is 0700, and an existing one that is not private is refused.
        make_private_dir(args.socket.absolute().parent, "socket directory")
        data_dir = make_private_dir(args.data_dir, "data directory")
    except PrivateDirectoryError as exc:
        say(str(exc))
        return 1
    return run_window(args.socket.absolute(), data_dir, debug=args.debug_shown)


if __name__ == "__main__":
    sys.exit(main())
