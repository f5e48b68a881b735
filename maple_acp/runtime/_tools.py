"""A lease's transient tool context: relay values, the external tool router slot, the process
groups of the credential-bearing children started on the lease's behalf, and the session
mode's gate on the tools that act (shell, external MCP calls, file writes and edits): the one
choke point that refuses what the mode forbids even to a backend that never asked."""

from __future__ import annotations

import codecs
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

import attrs
import trio

from maple_acp._exceptions import MapleAcpError
from maple_acp._tool_env import tool_child_environment
from maple_acp.model import ToolCategory, ToolState
from maple_acp.runtime._files import FileChange, Roots, edit_text_async, write_text_async
from maple_acp.runtime._live_output import OutputTail, ShellOutput
from maple_acp.runtime._relay import RelayRedactor

logger = logging.getLogger(__name__)

#: A child's output kept for the tool result; the rest is read and dropped so the child never
#: blocks on a full pipe.
MAX_SHELL_OUTPUT_BYTES = 64 * 1024
#: Between SIGTERM and SIGKILL of a credential-bearing process group.
CHILD_TERM_GRACE_S = 2.0
#: After SIGKILL, how long to wait for the kernel to end every member of a group.
KILL_SETTLE_S = 2.0
KILL_POLL_S = 0.005
#: One read of a child's output pipe.
SHELL_READ_BYTES = 65536
#: A command's live output reaches the caller at most this often per command: a command that
#: prints megabytes costs a few snapshots a second, not one update per read.
LIVE_OUTPUT_INTERVAL_S = 0.1
#: After a child exits, how long its output pipe may stay open (a background grandchild holds
#: it) before reading stops.
SHELL_OUTPUT_DRAIN_S = 1.0


class ExternalToolDefinition(Protocol):
    """The one static tool a router exposes to the model."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> Mapping[str, Any]: ...


class ExternalToolRouter(Protocol):
    """A lease-scoped router of caller-supplied tools (the transient MCP router fits it)."""

    def tool_definition(self) -> ExternalToolDefinition: ...

    async def call(
        self, tool_id: str, arguments: dict[str, Any], *, call_id: str | None = None
    ) -> dict[str, Any]:
        """Call one exact tool id. Raises an exception whose ``str`` is one safe line; its
        optional ``notice`` attribute is one more safe line for the user about the session.
        ``call_id`` is the tool call the user sees (given only when the caller has one)."""
        ...

    def revoke(self) -> None:
        """Cancel in-flight calls and drop connections and credentials. Synchronous."""
        ...


#: ``Turn.notice(level, text)``, as the tool context calls it.
Notify = Callable[[str, str], Awaitable[None]]


class ToolUnavailable(MapleAcpError):
    """A tool cannot be used in this context (no router, lease revoked, the session's mode
    forbids it). The message is safe."""


#: Where a command's live output goes (``ToolContext.run_shell``).
LiveSink = Callable[[ShellOutput], Awaitable[None]]


class BackgroundShells(Protocol):
    """A lease's background commands, as its turns' tools reach them (``_background``)."""

    def check_room(self) -> None:
        """``ToolUnavailable`` when no more may start now."""
        ...

    def next_handle(self) -> str: ...

    def start(
        self, *, handle: str, run_id: str, tool_id: str, command: str, cwd: str, tool: ToolState
    ) -> None: ...

    def read(self, handle: str) -> str:
        """New output since the last read; ``KeyError`` for an unknown handle."""
        ...

    def stop(self, handle: str) -> bool:
        """False when it had already ended; ``KeyError`` for an unknown handle."""
        ...


#: The session mode's answer for a category of tool: why it may not run (one line), or
#: ``None``. Asked at each call, so a mode change applies from the next one.
ToolGate = Callable[[ToolCategory], "str | None"]


@attrs.frozen(kw_only=True)
class ShellResult:
    exit_code: int | None
    #: Combined stdout and stderr, redacted, then at most ``MAX_SHELL_OUTPUT_BYTES`` of it.
    output: str
    truncated: bool
    #: The last ``LIVE_TAIL_CHARS`` characters of the output, redacted: what a row shows.
    tail: str = ""


def signal_group(pgid: int, signum: int) -> bool:
    """Signal a process group; False when it no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.warning("not allowed to signal process group %d", pgid)
        return False
    return True


async def _terminate_group(process: trio.Process) -> None:
    try:
        signal_group(process.pid, signal.SIGTERM)
        await trio.sleep(CHILD_TERM_GRACE_S)
    finally:
        # Also reached when the leader exits early: its descendants in the group may not have.
        signal_group(process.pid, signal.SIGKILL)
        # killpg returns before the kernel has ended every member; wait (bounded) so that a
        # caller told "the run ended" can rely on the whole group being gone.
        with trio.CancelScope(shield=True), trio.move_on_after(KILL_SETTLE_S):
            while _group_alive(process.pid):  # noqa: ASYNC110 - no event tells a group ended
                await trio.sleep(KILL_POLL_S)


class ToolContext:
    """What a lease lends its runs' tools. Cleared by ``revoke``; nothing in it is persisted."""

    def __init__(
        self, relay: Mapping[str, str] | None = None, *, env_allow: Collection[str] = ()
    ) -> None:
        self._relay: dict[str, str] = dict(relay or {})
        #: The host's ``tool_env_allow``: names its children inherit beyond the built-in ones.
        self._env_allow = frozenset(env_allow)
        # Kept past revocation until reap: a run still ending after a revoke writes its last
        # rows through it.
        self._redactor = RelayRedactor(self._relay)
        self._router: ExternalToolRouter | None = None
        self._notify: Notify | None = None
        self._groups: set[int] = set()
        self._revoked = False
        self._gate: ToolGate | None = None
        #: The lease's background commands (the lease installs them); none for a context no
        #: lease holds.
        self.background: BackgroundShells | None = None

    @property
    def revoked(self) -> bool:
        return self._revoked

    @property
    def relay_names(self) -> frozenset[str]:
        return frozenset(self._relay)

    @property
    def redactor(self) -> RelayRedactor:
        """Replaces this lease's relay values in text bound for the store, a log, the model
        or the client."""
        return self._redactor

    @property
    def router(self) -> ExternalToolRouter | None:
        return self._router

    @property
    def external_tools(self) -> tuple[ExternalToolDefinition, ...]:
        """The tools this lease adds to the backend's own: the one static ``external_mcp``
        tool while client-supplied MCP servers are connected, else none. The servers' own
        tools never appear here; they are reachable only through that one tool."""
        router = self._router
        if router is None or self._revoked:
            return ()
        return (router.tool_definition(),)

    @property
    def live_process_groups(self) -> frozenset[int]:
        """Process groups started here that still exist."""
        self._prune_groups()
        return frozenset(self._groups)

    def install_router(self, router: ExternalToolRouter | None) -> None:
        if self._revoked:
            if router is not None:
                router.revoke()
            raise ToolUnavailable("the session was revoked")
        self._router = router

    def replace_router(self, router: ExternalToolRouter | None) -> None:
        """Put ``router`` (already connected) in place of the current one, which is revoked:
        a re-attach swaps the caller's servers without a moment with neither."""
        if self._revoked:
            if router is not None:
                router.revoke()
            raise ToolUnavailable("the session was revoked")
        old, self._router = self._router, router
        if old is not None:
            try:
                old.revoke()
            except Exception:
                logger.warning("external tool router failed to revoke", exc_info=True)

    def set_gate(self, gate: ToolGate | None) -> None:
        """Install the session mode's gate (the lease does, once); ``None``: every tool may
        run, as for a context no lease holds."""
        self._gate = gate

    def check_allowed(self, category: ToolCategory) -> None:
        """Raise ``ToolUnavailable`` (with the mode's one line) if the session's mode forbids
        ``category`` now."""
        gate = self._gate
        reason = gate(category) if gate is not None else None
        if reason is not None:
            raise ToolUnavailable(reason)

    def child_environment(self) -> dict[str, str]:
        """The allow-listed part of the host's environment plus this lease's relay values (and
        no other lease's): never a provider's key, never a ``MAPLE_ACP_*`` setting."""
        return tool_child_environment(os.environ, self._relay, self._env_allow)

    async def call_external(
        self, tool_id: str, arguments: dict[str, Any], *, call_id: str | None = None
    ) -> dict[str, Any]:
        """Call a tool of the caller's MCP servers (``call_id``: the tool call's id, which a
        server that lives in the client is told). ``ToolUnavailable`` when there are none,
        the session was revoked, or its mode forbids MCP calls. A failure that carries a
        ``notice`` (a server that dropped its session) is also told to the user, as a warning
        notice of the run that made the call."""
        router = self._router
        if self._revoked:
            raise ToolUnavailable("the session was revoked")
        self.check_allowed(ToolCategory.EXTERNAL)
        if router is None:
            raise ToolUnavailable("no external MCP servers are connected to this session")
        try:
            if call_id is None:
                # A router written before tool call ids is called as it always was.
                return await router.call(tool_id, arguments)
            return await router.call(tool_id, arguments, call_id=call_id)
        except Exception as exc:
            notice = getattr(exc, "notice", None)
            notify = self._notify
            if isinstance(notice, str) and notice and notify is not None:
                await notify("warning", notice)
            raise

    def notify_through(self, notify: Notify | None) -> None:
        """Where notices about the lease's tools go: the current run's ``Turn.notice``."""
        self._notify = notify

    async def run_shell(
        self,
        command: str,
        *,
        cwd: str,
        tool_id: str = "",
        live: LiveSink | None = None,
        started: Callable[[int], None] | None = None,
    ) -> ShellResult:
        """Run ``command`` with ``/bin/sh`` in a new process group whose environment is
        ``child_environment()``. Cancellation terminates the whole group (SIGTERM, then SIGKILL
        after ``CHILD_TERM_GRACE_S``); so does ``revoke``. ``ToolUnavailable`` when the
        session was revoked or its mode forbids commands.

        ``live`` is given the output as it comes: a snapshot at most every
        ``LIVE_OUTPUT_INTERVAL_S`` while the command runs (one waiting ``live`` coalesces what
        comes meanwhile into the next one; the child is read all along, into a bounded tail),
        and a last one with the exit status once it exited. ``started`` is told the process
        group's id once the child runs."""
        if self._revoked:
            raise ToolUnavailable("the session was revoked")
        self.check_allowed(ToolCategory.EXECUTE)
        chunks: list[bytes | bytearray] = []
        kept = 0
        dropped = False
        # Read past the cut as far as a relay value reaches: a value the cut goes through is
        # redacted whole before the cut is made.
        window = MAX_SHELL_OUTPUT_BYTES + self._redactor.longest_value_bytes
        tail = OutputTail(self._redactor)
        shown = self._redactor.text(command)
        reader_done = trio.Event()
        finished = trio.Event()
        wake = trio.Event()
        publisher_done = trio.Event()
        self._prune_groups()
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                functools.partial(
                    trio.run_process,
                    command,
                    shell=True,
                    cwd=cwd,
                    env=self.child_environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    check=False,
                    deliver_cancel=_terminate_group,
                )
            )
            self._groups.add(process.pid)
            if started is not None:
                started(process.pid)
            if self._revoked:
                # Revoked while the child was starting: it must not outlive the lease.
                signal_group(process.pid, signal.SIGKILL)
            stdout = process.stdout
            assert stdout is not None

            async def read_output() -> None:
                nonlocal kept, dropped
                try:
                    while chunk := await stdout.receive_some(SHELL_READ_BYTES):
                        room = window - kept
                        if room > 0:
                            chunks.append(chunk[:room])
                            kept += min(room, len(chunk))
                        if len(chunk) > room:
                            dropped = True
                        tail.feed(chunk)
                        wake.set()
                finally:
                    reader_done.set()

            async def publish(sink: LiveSink) -> None:
                nonlocal wake
                try:
                    while True:
                        await wake.wait()
                        if finished.is_set():
                            return
                        wake = trio.Event()
                        text, appended = tail.take()
                        await sink(
                            ShellOutput(
                                tool_id=tool_id,
                                command=shown,
                                cwd=cwd,
                                tail=text,
                                appended=appended,
                            )
                        )
                        # The cadence: what comes meanwhile waits for the next snapshot.
                        with trio.move_on_after(LIVE_OUTPUT_INTERVAL_S):
                            await finished.wait()
                finally:
                    publisher_done.set()

            if live is not None:
                nursery.start_soon(publish, live)
            with trio.CancelScope() as reader_scope:
                nursery.start_soon(read_output)
                await process.wait()
                with trio.move_on_after(SHELL_OUTPUT_DRAIN_S):
                    await reader_done.wait()
            reader_scope.cancel()
            if live is not None:
                finished.set()
                wake.set()
                await publisher_done.wait()
                text, appended = tail.take(final=True)
                code = process.returncode
                await live(
                    ShellOutput(
                        tool_id=tool_id,
                        command=shown,
                        cwd=cwd,
                        tail=text,
                        appended=appended,
                        exited=True,
                        exit_code=code if code is None or code >= 0 else None,
                        signal=_signal_name(code),
                    )
                )
            nursery.cancel_scope.cancel()
        output, truncated = self._bounded_output(b"".join(chunks), complete=not dropped)
        if live is None:
            text, _ = tail.take(final=True)
        return ShellResult(
            exit_code=process.returncode, output=output, truncated=truncated, tail=text
        )

    async def write_text(
        self, root: Roots, path: str, content: str, *, dry_run: bool = False
    ) -> FileChange:
        """``write_text_async`` through the session: a real write (not a ``dry_run`` preview)
        raises ``ToolUnavailable`` when the session was revoked or its mode forbids edits."""
        if not dry_run:
            self._check_edit()
        return await write_text_async(root, path, content, dry_run=dry_run)

    async def edit_text(
        self, root: Roots, path: str, old_text: str, new_text: str, *, dry_run: bool = False
    ) -> FileChange:
        """``edit_text_async`` through the session, gated as ``write_text``."""
        if not dry_run:
            self._check_edit()
        return await edit_text_async(root, path, old_text, new_text, dry_run=dry_run)

    def _check_edit(self) -> None:
        if self._revoked:
            raise ToolUnavailable("the session was revoked")
        self.check_allowed(ToolCategory.EDIT)

    def _bounded_output(self, data: bytes, *, complete: bool) -> tuple[str, bool]:
        """A child's output as a tool may report it: redacted (a tool may print a relay value;
        neither the model nor any row may carry it), then cut to ``MAX_SHELL_OUTPUT_BYTES``
        without leaving a piece of a value; and whether it was cut. ``complete`` is False when
        the reader dropped output after ``data``."""
        # An incomplete trailing character of cut output is left out rather than replaced, so
        # that a piece of a value ends the text as itself.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = self._redactor.text(decoder.decode(data, final=complete))
        encoded = text.encode("utf-8", "surrogatepass")
        if complete and len(encoded) <= MAX_SHELL_OUTPUT_BYTES:
            return text, False
        kept = encoded[:MAX_SHELL_OUTPUT_BYTES].decode("utf-8", "ignore")
        return self._redactor.without_partial_value(kept), True

    def revoke(self) -> None:
        """Synchronously drop the relay values and the router, and send SIGTERM to every live
        process group started here. ``reap`` sends the SIGKILL."""
        self._revoked = True
        self._notify = None
        self._relay.clear()
        router, self._router = self._router, None
        if router is not None:
            try:
                router.revoke()
            except Exception:
                logger.warning("external tool router failed to revoke", exc_info=True)
        for pgid in list(self._groups):
            if not signal_group(pgid, signal.SIGTERM):
                self._groups.discard(pgid)

    async def reap(self) -> None:
        """After ``revoke``: give the groups their grace, then SIGKILL what is left."""
        self._prune_groups()
        if self._groups:
            with trio.move_on_after(CHILD_TERM_GRACE_S):
                while self._groups:
                    await trio.sleep(0.05)
                    self._prune_groups()
        for pgid in list(self._groups):
            signal_group(pgid, signal.SIGKILL)
        self._groups.clear()
        self._redactor.clear()

    def _prune_groups(self) -> None:
        for pgid in list(self._groups):
            if not _group_alive(pgid):
                self._groups.discard(pgid)


def _signal_name(returncode: int | None) -> str | None:
    """The signal that ended a child (``returncode`` is minus its number), else ``None``."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return None


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is in the group. ``killpg(pgid, 0)`` alone counts
    zombies, which a container's init may never reap."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # Fields after the command name: state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False
