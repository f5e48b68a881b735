"""A lease's background commands: shell commands that go on past their tool call and its turn,
each a task in the lease's own nursery.

A background command is a child of the lease, never an orphan: the lease's revocation (a
close, a delete, a disconnect, a sign-out) cancels the nursery, whose cancellation ends each
command's process group (SIGTERM, then SIGKILL), and the lease's cleanup reaps what is left,
all inside the lease's cleanup bound. Each command keeps its own tool call: its output goes to
the lease holder as session events while it runs, and its final row (exit status and the tail
of its output) is stored where the call was, so a load replays it.

Resource handling: at most ``MAX_BACKGROUND_COMMANDS`` run at once; each keeps a bounded tail
and a bounded unread part for the model. Error handling: a command that cannot start fails its
row; the final row's write is bounded and logged when it fails, never raised.
"""

from __future__ import annotations

import itertools
import logging
import signal
from collections.abc import Callable
from typing import Final, Literal

import attrs
import trio

from maple_acp.model import ItemKind, TimelineItem, ToolCategory, ToolState, ToolStatus
from maple_acp.runtime._live_output import LIVE_TAIL_CHARS, ShellOutput, exit_line, shell_row_text
from maple_acp.runtime._session_events import BackgroundEnded, BackgroundOutput, SessionEvent
from maple_acp.runtime._tool_rows import prepared_tool
from maple_acp.runtime._tools import (
    CHILD_TERM_GRACE_S,
    ToolContext,
    ToolUnavailable,
    signal_group,
)
from maple_acp.store import TaskStore

logger = logging.getLogger(__name__)

#: Background commands running at once in one session: a dev server, a watcher and a test run
#: or two; more would be a host's processes in the model's hands.
MAX_BACKGROUND_COMMANDS: Final = 4
#: Ended commands a listing still shows (their exit status), newest first kept.
MAX_LISTED_EXITED: Final = 16
#: New output the model reads at once with ``shell_output``: the latest part, like the tail.
MAX_UNREAD_CHARS: Final = LIVE_TAIL_CHARS
#: Writing an ended command's final row, at most (it may run while the lease closes).
FINAL_ROW_WRITE_S: Final = 1.0

BackgroundStatus = Literal["running", "exited"]


@attrs.frozen(kw_only=True)
class BackgroundInfo:
    """One background command as a listing shows it."""

    handle: str
    command: str
    status: BackgroundStatus
    exit_code: int | None = None


class _Command:
    __slots__ = (
        "command",
        "exit_code",
        "exited",
        "handle",
        "pid",
        "run_id",
        "spawned",
        "stopping",
        "tool",
        "tool_id",
        "unread",
        "unread_cut",
    )

    def __init__(self, handle: str, tool_id: str, run_id: str, command: str, tool: ToolState):
        self.handle = handle
        self.tool_id = tool_id
        self.run_id = run_id
        self.command = command
        self.tool = tool
        self.exited = False
        self.exit_code: int | None = None
        self.unread = ""
        self.unread_cut = False
        self.pid: int | None = None
        self.stopping = trio.Event()
        self.spawned = trio.Event()

    def add_unread(self, output: ShellOutput) -> None:
        if output.appended is None:
            self.unread, self.unread_cut = output.tail, True
            return
        unread = self.unread + output.appended
        if len(unread) > MAX_UNREAD_CHARS:
            unread, self.unread_cut = unread[-MAX_UNREAD_CHARS:], True
        self.unread = unread

    def info(self) -> BackgroundInfo:
        return BackgroundInfo(
            handle=self.handle,
            command=self.command,
            status="exited" if self.exited else "running",
            exit_code=self.exit_code,
        )


class BackgroundCommands:
    """The background commands of one lease (see the module docstring)."""

    def __init__(
        self,
        *,
        task_id: str,
        tools: ToolContext,
        nursery: Callable[[], trio.Nursery],
        store: TaskStore,
        now_ms: Callable[[], int],
        publish: Callable[[SessionEvent], None],
    ) -> None:
        self._task_id = task_id
        self._tools = tools
        self._nursery = nursery
        self._store = store
        self._now_ms = now_ms
        self._publish = publish
        self._numbers = itertools.count(1)
        self._commands: dict[str, _Command] = {}

    @property
    def running(self) -> int:
        return sum(not command.exited for command in self._commands.values())

    def check_room(self) -> None:
        """``ToolUnavailable`` (one line naming the limit) when no more may start now, or the
        session's mode forbids commands."""
        if self._tools.revoked:
            raise ToolUnavailable("the session was revoked")
        self._tools.check_allowed(ToolCategory.EXECUTE)
        if self.running >= MAX_BACKGROUND_COMMANDS:
            raise ToolUnavailable(
                f"at most {MAX_BACKGROUND_COMMANDS} background commands run at once in a "
                "session: stop one first"
            )

    def next_handle(self) -> str:
        return f"bg-{next(self._numbers)}"

    def start(
        self, *, handle: str, run_id: str, tool_id: str, command: str, cwd: str, tool: ToolState
    ) -> None:
        """Start ``command`` in the lease's nursery under ``handle``; ``tool`` is its tool
        call's row as sent (``in_progress``), which its final row replaces."""
        self.check_room()
        entry = _Command(handle, tool_id, run_id, self._tools.redactor.text(command), tool)
        self._commands[handle] = entry
        self._forget_old()
        self._nursery().start_soon(self._serve, entry, command, cwd)

    def list(self) -> tuple[BackgroundInfo, ...]:
        return tuple(command.info() for command in self._commands.values())

    def read(self, handle: str) -> str:
        """What ``handle`` printed since the last read (at most ``MAX_UNREAD_CHARS``, the
        latest), with its status first. ``KeyError`` for an unknown handle."""
        entry = self._commands[handle]
        text, cut = entry.unread, entry.unread_cut
        entry.unread, entry.unread_cut = "", False
        if entry.exited:
            status = f"{handle} exited ({exit_line(entry.exit_code)})"
        else:
            status = f"{handle} is running"
        if cut:
            status += f"; earlier output was dropped, the last {len(text)} characters follow"
        return f"{status}\n{text}" if text else f"{status}; no new output"

    def stop(self, handle: str) -> bool:
        """Ask ``handle`` to end (SIGTERM, then SIGKILL after the grace). False when it had
        already ended; ``KeyError`` for an unknown handle."""
        entry = self._commands[handle]
        if entry.exited:
            return False
        entry.stopping.set()
        return True

    def _forget_old(self) -> None:
        exited = [handle for handle, entry in self._commands.items() if entry.exited]
        for handle in exited[: max(0, len(exited) - MAX_LISTED_EXITED)]:
            del self._commands[handle]

    async def _serve(self, entry: _Command, command: str, cwd: str) -> None:
        last: ShellOutput | None = None

        async def live(output: ShellOutput) -> None:
            nonlocal last
            last = output
            entry.add_unread(output)
            self._publish(BackgroundOutput(self._task_id, output))

        ended = "the session ended"
        status, tail = ToolStatus.FAILED, ""
        output, truncated = "", False
        try:
            async with trio.open_nursery() as nursery:

                async def stopper() -> None:
                    await entry.stopping.wait()
                    # Asked before the child ran: it is stopped once it does.
                    await entry.spawned.wait()
                    pid = entry.pid
                    assert pid is not None
                    signal_group(pid, signal.SIGTERM)
                    await trio.sleep(CHILD_TERM_GRACE_S)
                    signal_group(pid, signal.SIGKILL)

                nursery.start_soon(stopper)
                result = await self._tools.run_shell(
                    command, cwd=cwd, tool_id=entry.tool_id, live=live, started=_setter(entry)
                )
                nursery.cancel_scope.cancel()
            entry.exit_code = result.exit_code
            ended = exit_line(result.exit_code)
            status = ToolStatus.COMPLETED if result.exit_code == 0 else ToolStatus.FAILED
            tail, output, truncated = result.tail, result.output, result.truncated
        except (ToolUnavailable, OSError) as exc:
            status, tail, ended = ToolStatus.FAILED, "", str(exc) or type(exc).__name__
        except BaseException:
            # Cancelled with the lease (or the host): the row still ends, with what came.
            status, tail = ToolStatus.FAILED, last.tail if last is not None else ""
            # What came is known only as its tail, which may have lost the start.
            output, truncated = tail, last is not None
            raise
        finally:
            entry.exited = True
            with trio.CancelScope(shield=True):
                await self._end(entry, status, ended, tail, output, truncated)

    async def _end(
        self,
        entry: _Command,
        status: ToolStatus,
        ended: str,
        tail: str,
        output: str,
        truncated: bool,
    ) -> None:
        text = tail if status is ToolStatus.COMPLETED else shell_row_text(ended, tail)
        # The shape of a foreground command's raw output, and the handle and command besides:
        # a client that prints raw output reads both kinds of row alike.
        raw = {
            "exitCode": entry.exit_code,
            "output": output,
            "truncated": truncated,
            "handle": entry.handle,
            "command": entry.command,
        }
        tool = prepared_tool(
            attrs.evolve(entry.tool, status=status, output_text=text, raw_output=raw),
            self._tools.redactor,
        )
        item = TimelineItem(
            item_id=entry.tool_id,
            kind=ItemKind.TOOL,
            created_ms=self._now_ms(),
            run_id=entry.run_id,
            text=tool.title or tool.name,
            tool=tool,
        )
        with trio.move_on_after(FINAL_ROW_WRITE_S) as bounded:
            try:
                await self._store.upsert_items(self._task_id, [item], now_ms=item.created_ms)
            except Exception:
                logger.warning("could not store the end of %s", entry.handle, exc_info=True)
        if bounded.cancelled_caught:
            logger.warning("storing the end of %s took too long", entry.handle)
        self._publish(BackgroundEnded(self._task_id, entry.tool_id, tool))


def _setter(entry: _Command) -> Callable[[int], None]:
    def started(pid: int) -> None:
        entry.pid = pid
        entry.spawned.set()

    return started
