"""A lease's session events and their stream: what happens outside any prompt (goal and mode
changes, goal cycles, background commands, the prompt queue, revocation)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import TypeAlias

import attrs
import trio

from maple_acp.model import GoalRecord, SessionMode, ToolState
from maple_acp.runtime._live_output import ShellOutput
from maple_acp.runtime._run import Run


@attrs.frozen
class GoalChanged:
    """The task's goal changed; ``goal`` is the new snapshot, ``None`` when cleared."""

    task_id: str
    goal: GoalRecord | None


@attrs.frozen
class CycleStarted:
    """The runtime started an autonomous goal cycle. Consume ``run.events()`` exactly as for
    a prompt's run; nobody else will."""

    run: Run


@attrs.frozen
class PromptStarted:
    """An observing window's prompt started a run (``Observer.hand_over``): the holder reads
    ``run.events()`` exactly as for its own prompt's run, nobody else will, shows the user
    message ``text`` first (it did not send it), and sets ``shown`` once it showed the run's
    end (the window that prompted answers after that, and the next prompt starts after it)."""

    run: Run
    text: str
    shown: trio.Event = attrs.field(factory=trio.Event, eq=False)


@attrs.frozen
class LeaseRevoked:
    """The lease lost its capabilities (sign-out, account change, drain or revocation). Its
    holder should release it."""

    reason: str


@attrs.frozen
class ModeChanged:
    """The session's mode changed (``SessionLease.set_mode``); ``mode`` is the new one. It
    applies from the next tool call, also within a running turn."""

    task_id: str
    mode: SessionMode


@attrs.frozen
class BackgroundOutput:
    """A background command's output while it runs, on its tool call (``output.tool_id``),
    outside any turn. Snapshots of one command coalesce while the holder is slow."""

    task_id: str
    output: ShellOutput


@attrs.frozen
class BackgroundEnded:
    """A background command ended: its tool call's final row (also stored)."""

    task_id: str
    tool_id: str
    tool: ToolState


@attrs.frozen(kw_only=True)
class QueuedPrompt:
    """One waiting prompt as a listing shows it: its id, the start of its text (one line of at
    most ``_prompt_queue.MAX_PREVIEW_CHARS``) and when it was queued (Unix milliseconds)."""

    entry_id: str
    preview: str
    queued_ms: int


@attrs.frozen
class QueueChanged:
    """The session's waiting prompts changed (one queued, started, removed or withdrawn):
    ``entries`` is the queue as it is now, first to run first."""

    task_id: str
    entries: tuple[QueuedPrompt, ...]


SessionEvent: TypeAlias = (
    GoalChanged
    | CycleStarted
    | PromptStarted
    | LeaseRevoked
    | ModeChanged
    | BackgroundOutput
    | BackgroundEnded
    | QueueChanged
)

logger = logging.getLogger(__name__)

#: Snapshots that coalesce: of each kind only the newest waiting one matters.
_SNAPSHOTS = (GoalChanged, ModeChanged, QueueChanged)

#: Session events waiting for the lease holder. Goal and mode snapshots coalesce and a goal
#: cycle starts only when there is room, so this bound is never hit by a slow reader; it only
#: caps memory.
SESSION_EVENT_QUEUE = 64


class SessionEvents:
    """The lease's session event stream (goal changes, goal cycles, revocation), readable by one
    consumer; it ends when the lease's cleanup ends."""

    def __init__(self, mirror: Callable[[SessionEvent], None] | None = None) -> None:
        #: Told of every event published (the lease's observers), whatever this queue keeps.
        self._mirror = mirror
        self._queue: collections.deque[SessionEvent] = collections.deque()
        self._changed = trio.Event()
        self._closed = False
        self._taken = False

    def publish(self, event: SessionEvent) -> None:
        if self._closed:
            return
        if self._mirror is not None:
            self._mirror(event)
        if isinstance(event, BackgroundOutput):
            # One waiting snapshot per command: the newest, carrying what the older added.
            for index, queued in enumerate(self._queue):
                if (
                    isinstance(queued, BackgroundOutput)
                    and queued.output.tool_id == event.output.tool_id
                ):
                    del self._queue[index]
                    event = attrs.evolve(event, output=event.output.after(queued.output))
                    break
            self._queue.append(event)
            self._wake()
            return
        if isinstance(event, _SNAPSHOTS):
            kind = type(event)
            self._queue = collections.deque(
                queued for queued in self._queue if not isinstance(queued, kind)
            )
        # A prompt's run is never dropped: nobody else would read it (one runs at a time).
        elif len(self._queue) >= SESSION_EVENT_QUEUE and not isinstance(event, PromptStarted):
            logger.warning("session event queue full; dropping %s", type(event).__name__)
            return
        self._queue.append(event)
        self._wake()

    def take(self) -> SessionEvents:
        """The stream, for its one consumer."""
        if self._taken:
            raise RuntimeError("a lease's session events can be read only once")
        self._taken = True
        return self

    def has_room(self) -> bool:
        return len(self._queue) < SESSION_EVENT_QUEUE - 1

    async def wait_room(self) -> None:
        while not self.has_room() and not self._closed:
            await self._changed.wait()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def __aiter__(self) -> SessionEvents:
        return self

    async def __anext__(self) -> SessionEvent:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            await self._changed.wait()
        event = self._queue.popleft()
        self._wake()
        return event
