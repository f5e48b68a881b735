"""A lease's observers: more windows on one held task besides its holder's (a second editor, a
phone's browser, a host's own window).

The holder keeps the lease; an observer follows it. When it attaches, an observer gets a
snapshot of what the runs being read have said so far (each message whole, each tool call's
latest row), then a feed of everything after: each batch of a run's events as the holder's
side reads it, a prompt's user message as its run starts, and the session events (goal,
mode, background commands). The snapshot and the feed meet exactly: both are taken at one
moment, with no checkpoint between, so nothing is in both and nothing in neither.

An observer prompts through the lease as the holder does (the one slot and queue); the run its
prompt starts is handed to the holder's side (:meth:`Observer.hand_over`, a ``PromptStarted``
session event), the run's one reader, so every window sees it as it sees any run: the holder
as it reads it, the observers through their feeds. :meth:`Observer.shown` tells the window's
request when its feed has handled the run's end.

A permission request of a run is a :class:`~maple_acp.runtime._permissions.SharedQuestion`:
the holder and every observer attached while it waits (a late one too) answer it through a
ticket of their own, and the first clean answer decides it.

Resource handling: each observer's feed is bounded (:data:`OBSERVER_BACKLOG` events); one
that falls that far behind is detached, so a slow window never holds up the run, the holder
or another window. Detaching withdraws the observer's tickets. When the lease is revoked
(the holder closed it or went away, the account changed) every observer is detached.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from functools import partial
from typing import Final, TypeAlias

import attrs
import trio

from maple_acp.model import ItemKind, TimelineItem, ToolState
from maple_acp.runtime._attachments import Prompt
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._events import (
    PermissionRequest,
    RunEnded,
    RunEvent,
    TextChunk,
    ThoughtChunk,
    ToolRow,
)
from maple_acp.runtime._permissions import PermissionTicket, SharedQuestion
from maple_acp.runtime._run import Run
from maple_acp.runtime._session_events import (
    BackgroundEnded,
    BackgroundOutput,
    GoalChanged,
    ModeChanged,
    PromptStarted,
    QueueChanged,
    SessionEvent,
)

logger = logging.getLogger(__name__)

#: Observers of one session at a time: each is one more projection of every update, and a
#: desk, a laptop and a phone or two is what following a session takes.
MAX_OBSERVERS: Final = 4
#: Events waiting for one observer, at most: a window this far behind is detached (told why)
#: rather than holding up the run, the holder or the other windows.
OBSERVER_BACKLOG: Final = 4096
#: Events of a run kept as read before they are folded into its snapshot (the fold is the
#: tap's only per-event work): a run no observer attaches to within this many events is
#: never folded, and one that streams longer keeps its messages' text, not every chunk.
FOLD_AFTER: Final = 65_536

#: Why an observer was detached.
HOLDER_LEFT: Final = "the window holding the session closed it or went away"
FELL_BEHIND: Final = "this window fell too far behind the session"


@attrs.frozen
class PromptAdmitted:
    """A prompt's user message was admitted, and its run starts."""

    run_id: str
    message_id: str
    text: str


@attrs.frozen
class RunBatch:
    """Events of run ``run_id``, in order, as the holder's side read them (its permission
    requests carry this observer's own tickets)."""

    run_id: str
    events: list[RunEvent]


@attrs.frozen
class ObserverDetached:
    """The last item of a feed: the observer no longer follows the session."""

    reason: str


ObservedEvent: TypeAlias = (
    PromptAdmitted
    | RunBatch
    | GoalChanged
    | ModeChanged
    | BackgroundOutput
    | BackgroundEnded
    | QueueChanged
    | ObserverDetached
)

_MIRRORED = (GoalChanged, ModeChanged, BackgroundOutput, BackgroundEnded, QueueChanged)


@attrs.frozen
class RunSnapshot:
    """What a run being read had said when an observer attached: each message whole, each tool
    call's latest row, in the order they first came. ``TimelineItem`` values, as a replay
    shows them."""

    run_id: str
    items: tuple[TimelineItem, ...]


class Observer:
    """One window following a lease it does not hold. Read it (``async for item in
    observer``) until :class:`ObserverDetached`; ``detach()`` when the window goes."""

    def __init__(
        self,
        snapshot: tuple[RunSnapshot, ...],
        remove: Callable[[Observer], None],
        publish: Callable[[SessionEvent], None],
    ):
        #: The runs being read when it attached, as far as they had been read.
        self.snapshot = snapshot
        self._remove = remove
        self._publish = publish
        #: Runs this window's prompts started, until its reader has handled their ends.
        self._own: dict[str, trio.Event] = {}
        #: The same runs as handed to the holder, until this window's request asked.
        self._handed: dict[str, PromptStarted] = {}
        #: The run whose last batch the reader was handed, handled once it asks again.
        self._ending: str | None = None
        self._queue: collections.deque[ObservedEvent] = collections.deque()
        self._events = 0
        self._changed = trio.Event()
        self.detached: str | None = None

    @property
    def feed_runs(self) -> frozenset[str]:
        """Runs the feed has items of, not read yet: a replay leaves their stored rows out
        (the feed brings them)."""
        return frozenset(
            item.run_id for item in self._queue if isinstance(item, PromptAdmitted | RunBatch)
        )

    def hand_over(self, run: Run, text: str) -> None:
        """A run this window's prompt (with user message ``text``) started: the holder's side
        reads it (``PromptStarted``), this window follows it through its feed like any run.
        Call once, before anything reads the run (nothing does until this publishes it)."""
        self._own[run.id] = trio.Event()
        if self.detached is not None:
            self._own.pop(run.id).set()
        started = self._handed[run.id] = PromptStarted(run, text)
        self._publish(started)

    async def shown(self, run_id: str) -> None:
        """Wait until this window's reader has handled the last batch of run ``run_id``
        (a run ``hand_over`` gave the holder; it asked for the item after it), or the window
        no longer follows: what it answers about the run then comes after the run's updates.
        Then until the holder's side showed the run's end too (``PromptStarted.shown``)."""
        event = self._own.get(run_id)
        if event is not None:
            await event.wait()
        started = self._handed.get(run_id)
        if started is not None:
            await started.shown.wait()
            self._handed.pop(run_id, None)

    def offer(self, item: ObservedEvent) -> None:
        if self.detached is not None:
            _withdraw(item)
            return
        size = len(item.events) if isinstance(item, RunBatch) else 1
        if self._events + size > OBSERVER_BACKLOG:
            _withdraw(item)
            logger.info("an observer fell behind; detaching it")
            self.detach(FELL_BEHIND)
            return
        self._events += size
        self._queue.append(item)
        self._wake()

    def detach(self, reason: str = "the window closed") -> None:
        """Stop following: what waits unread is dropped (its permission tickets withdrawn)
        and the feed ends with :class:`ObserverDetached`. Idempotent."""
        if self.detached is not None:
            return
        self.detached = reason
        for item in self._queue:
            _withdraw(item)
        self._queue.clear()
        self._events = 0
        self._queue.append(ObserverDetached(reason))
        self._remove(self)
        # Its runs' answers need not wait for a reader that no longer reads.
        for event in self._own.values():
            event.set()
        self._own.clear()
        for started in self._handed.values():
            started.shown.set()
        self._handed.clear()
        self._ending = None
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def __aiter__(self) -> Observer:
        return self

    async def __anext__(self) -> ObservedEvent:
        if self._ending is not None:
            # The reader asks again: it handled the last batch of one of this window's runs.
            self._own.pop(self._ending).set()
            self._ending = None
        while not self._queue:
            if self.detached is not None:
                raise StopAsyncIteration
            await self._changed.wait()
        item = self._queue.popleft()
        if isinstance(item, ObserverDetached):
            # Nothing follows the end: a later read stops.
            return item
        if isinstance(item, RunBatch):
            self._events -= len(item.events)
            if item.run_id in self._own and type(item.events[-1]) is RunEnded:
                self._ending = item.run_id
        else:
            self._events -= 1
        return item


def _withdraw(item: ObservedEvent) -> None:
    """An item no window will handle: its permission tickets give up."""
    if isinstance(item, RunBatch):
        for event in item.events:
            if type(event) is PermissionRequest and isinstance(event.responder, PermissionTicket):
                event.responder.answer(None)


class _ReadRun:
    """A run being read: the batches read so far (folded into messages and tool rows once
    an observer asks, or once they are many) and its questions."""

    def __init__(self, run_id: str, created_ms: int) -> None:
        self.run_id = run_id
        self._created_ms = created_ms
        self._batches: list[list[RunEvent]] = []
        self._retained = 0
        #: (kind, id) -> message kind and text pieces, or the tool call's latest row.
        self._rows: dict[tuple[str, str], tuple[ItemKind, list[str]] | ToolState] = {}
        self.questions: list[tuple[SharedQuestion, PermissionRequest]] = []

    def read(self, batch: list[RunEvent]) -> None:
        self._batches.append(batch)
        self._retained += len(batch)
        if self._retained >= FOLD_AFTER:
            self._fold()

    def _fold(self) -> None:
        rows = self._rows
        # The chunk being joined: consecutive chunks of one message (the streaming case) cost
        # an append each, without a lookup.
        current: tuple[type, str] | None = None
        pieces: list[str] = []
        for batch in self._batches:
            for event in batch:
                kind = type(event)
                if kind is TextChunk or kind is ThoughtChunk:
                    chunk: TextChunk | ThoughtChunk = event  # type: ignore[assignment]
                    if (
                        current is not None
                        and current[0] is kind
                        and current[1] == chunk.message_id
                    ):
                        pieces.append(chunk.text)
                        continue
                    key = ("m", chunk.message_id)
                    row = rows.get(key)
                    if isinstance(row, tuple):
                        pieces = row[1]
                    else:
                        item_kind = ItemKind.ASSISTANT if kind is TextChunk else ItemKind.THOUGHT
                        pieces = []
                        rows[key] = (item_kind, pieces)
                    pieces.append(chunk.text)
                    current = (kind, chunk.message_id)
                elif kind is ToolRow:
                    tool_row: ToolRow = event  # type: ignore[assignment]
                    rows[("t", tool_row.tool_id)] = tool_row.tool
        self._batches = []
        self._retained = 0

    def snapshot(self) -> RunSnapshot:
        self._fold()
        items: list[TimelineItem] = []
        for (kind, item_id), row in self._rows.items():
            if kind == "m":
                assert isinstance(row, tuple)
                text = "".join(row[1])
                row[1][:] = [text]
                items.append(
                    TimelineItem(
                        item_id=item_id,
                        kind=row[0],
                        created_ms=self._created_ms,
                        run_id=self.run_id,
                        text=text,
                    )
                )
            else:
                assert isinstance(row, ToolState)
                items.append(
                    TimelineItem(
                        item_id=item_id,
                        kind=ItemKind.TOOL,
                        created_ms=self._created_ms,
                        run_id=self.run_id,
                        text=row.title,
                        tool=row,
                    )
                )
        return RunSnapshot(self.run_id, tuple(items))


class SessionObservers:
    """The observers of one lease, and the tap on each of its runs. ``now_ms`` dates the
    snapshot's rows; ``publish`` gives the holder a run an observer's prompt started."""

    def __init__(
        self, *, now_ms: Callable[[], int], publish: Callable[[SessionEvent], None]
    ) -> None:
        self._now_ms = now_ms
        self._publish = publish
        self._observers: list[Observer] = []
        self._runs: dict[str, _ReadRun] = {}
        self._ended: str | None = None

    def __len__(self) -> int:
        return len(self._observers)

    def attach(self) -> Observer:
        """A new observer, its snapshot and its feed taken now. ``OBSERVERS_FULL`` beyond
        :data:`MAX_OBSERVERS`; ``LEASE_REVOKED`` once the lease is gone."""
        if self._ended is not None:
            raise RuntimeRejection(RejectionKind.LEASE_REVOKED, "the session was closed")
        if len(self._observers) >= MAX_OBSERVERS:
            raise RuntimeRejection(
                RejectionKind.OBSERVERS_FULL,
                f"the session already has {MAX_OBSERVERS} observing windows, the most it "
                "takes; close one of them first",
            )
        observer = Observer(
            tuple(run.snapshot() for run in self._runs.values()),
            self._observers.remove,
            self._publish,
        )
        self._observers.append(observer)
        # A question still waiting reaches the new window too: following a session from
        # a phone is mostly answering what it asks.
        for run in self._runs.values():
            for question, event in run.questions:
                if not question.request_done:
                    late = attrs.evolve(event, responder=question.ticket())
                    observer.offer(RunBatch(run.run_id, [late]))
        return observer

    def end(self, reason: str = HOLDER_LEFT) -> None:
        """The lease is gone: detach every observer, and attach none from now on."""
        self._ended = reason
        for observer in list(self._observers):
            observer.detach(reason)

    def mirror(self, event: SessionEvent) -> None:
        """A session event the holder is told of: every observer is told too."""
        if self._observers and isinstance(event, _MIRRORED):
            for observer in list(self._observers):
                observer.offer(event)

    def watch(self, run: Run, prompt: Prompt | None) -> None:
        """A run starts (``prompt``: a prompt's, whose user message it answers): tap its
        events as they are read. Call before anyone reads them."""
        read = self._runs[run.id] = _ReadRun(run.id, self._now_ms())
        if prompt is not None:
            admitted = PromptAdmitted(run.id, run.user_message_id, prompt.text)
            for observer in list(self._observers):
                observer.offer(admitted)
        run.tap(partial(self._read, read))

    def _read(self, read: _ReadRun, batch: list[RunEvent]) -> list[RunEvent]:
        """The tap: one call per batch the holder's side reads (the streaming path: a batch
        without a permission request, with nobody observing, costs a type scan and an
        append)."""
        copies: list[list[RunEvent]] | None = None
        if PermissionRequest in map(type, batch):
            batch, copies = self._share_questions(read, batch)
        read.read(batch)
        run_id = read.run_id
        if type(batch[-1]) is RunEnded:
            self._runs.pop(run_id, None)
        if self._observers:
            for index, observer in enumerate(list(self._observers)):
                observer.offer(RunBatch(run_id, copies[index] if copies is not None else batch))
        return batch

    def _share_questions(
        self, read: _ReadRun, batch: list[RunEvent]
    ) -> tuple[list[RunEvent], list[list[RunEvent]]]:
        """The holder's batch and each observer's, each permission request with a ticket of
        its own on one shared question."""
        holder = list(batch)
        copies = [list(batch) for _ in self._observers]
        for index, event in enumerate(batch):
            if not isinstance(event, PermissionRequest):
                continue
            request = event
            if isinstance(request.responder, PermissionTicket):
                continue
            question = SharedQuestion(request.responder)
            holder[index] = attrs.evolve(request, responder=question.ticket())
            for copy in copies:
                copy[index] = attrs.evolve(request, responder=question.ticket())
            read.questions = [(q, e) for q, e in read.questions if not q.request_done] + [
                (question, request)
            ]
        return holder, copies
