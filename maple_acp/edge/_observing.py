"""Several windows on one session: a connection that follows a session another connection
holds (``session/load`` or ``session/resume`` with ``_meta["maple.attach"] = "observe"``).

Attachment is the runtime's (``AgentService.observe_task``: the holder keeps the lease, the
runtime gives the window an ``Observer``, a snapshot and a feed); this module only projects
that feed for one connection, with this connection's dialect and under this connection's
outbound credit: a window that reads slowly holds up only itself (the runtime detaches it if
it falls too far behind).

What an observing window gets: the history as a load replays it, in which the turn running
when it attached shows what it said so far as whole messages (the feed carries the rest, so
nothing is shown twice); then, once the answer is queued, every live update of the session;
each permission question (:mod:`~maple_acp.edge._asking`); and a notice when it no longer
follows (its holder closed the session or went away, or it fell behind), after which the
session is gone for this connection. Its ``session/close`` and its disconnect detach it only.

An observing window prompts and steers as the holder does, on the one lease: its prompt takes
the slot or waits in the session's queue, and the run it starts is handed to the holder
(``Observer.hand_over``, a ``PromptStarted`` session event): the holder's connection reads
and shows it, user message first, and every window, this one too, follows it through its
feed, so each sees each update once. The window's request waits for the run's end on its
feed (:func:`own_run_outcome`) before it answers. Its ``session/cancel`` cancels the running
turn and withdraws every waiting prompt, whoever sent it; ``_session/queue`` lists, removes
and clears the session's queue from any window.

Resource handling: the feed is read by one task in the connection's nursery, started once the
load's or resume's answer is queued, inside the session's update scope; permission questions
run in a nursery of that task. Error handling: an update too large for this connection is
left out (logged), never ending the holder's turn; a closed connection ends the task.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import trio

from maple_acp.edge._asking import ask_permission
from maple_acp.edge._client import ClientChannel
from maple_acp.edge._dialect import Dialect, ImageSlot, Outbound, Projection
from maple_acp.edge._session import EdgeSession, SessionClosed
from maple_acp.edge._sessions import SessionTable
from maple_acp.model import ItemKind, TimelineItem
from maple_acp.rpc import ConnectionClosed, OutboundFrameTooLarge, after_answer
from maple_acp.runtime import (
    AgentService,
    BackgroundEnded,
    BackgroundOutput,
    GoalChanged,
    ModeChanged,
    Observer,
    ObserverDetached,
    PermissionRequest,
    PromptAdmitted,
    QueueChanged,
    Run,
    RunBatch,
    RunEnded,
    RunNotice,
    RunOutcome,
)
from maple_acp.wire import INVALID_PARAMS, Meta, ProtocolError

logger = logging.getLogger(__name__)

#: The ``_meta`` key of a load or resume that asks to follow a session held elsewhere.
ATTACH_KEY: Final = "maple.attach"
#: Its one known value.
OBSERVE: Final = "observe"
#: How long an observing window's answer about its own run waits for its feed to show the
#: run's end: a window that stopped reading gets its answer anyway.
SHOWN_BOUND_S: Final = 5.0

SessionEventForward = Callable[
    [EdgeSession, GoalChanged | ModeChanged | BackgroundOutput | BackgroundEnded | QueueChanged],
    Awaitable[None],
]


def attach_mode(meta: Meta | None) -> bool:
    """Whether a load or resume asks to observe: ``-32602`` for any value but ``"observe"``."""
    if meta is None or ATTACH_KEY not in meta:
        return False
    if meta[ATTACH_KEY] == OBSERVE:
        return True
    raise ProtocolError(INVALID_PARAMS, f'_meta["{ATTACH_KEY}"]: the only value is "{OBSERVE}"')


def admitted_message(
    projector: Projection, run_id: str, message_id: str, text: str
) -> list[Outbound]:
    """A prompt's user message as a window that did not send it is shown it (an observing
    window's feed, or the holder shown an observing window's prompt): as a replay shows it."""
    user = TimelineItem(
        item_id=message_id, kind=ItemKind.USER, created_ms=0, run_id=run_id, text=text
    )
    return [u for u in projector.history([user]) if not isinstance(u, ImageSlot)]


async def own_run_outcome(observer: Observer, run: Run) -> RunOutcome:
    """The outcome of a run an observing window's prompt started (and handed to the holder),
    once the window's feed has shown its end (bounded: a window that stopped reading does not
    hold its answer)."""
    outcome = await run.wait()
    with trio.move_on_after(SHOWN_BOUND_S):
        await observer.shown(run.id)
    return outcome


class SessionFollowing:
    """The sessions one connection observes: attaching, the replay's rows, the feed's pump.
    ``forward`` sends a session event (the goal flow's); ``dialect`` is the connection's."""

    def __init__(
        self,
        table: SessionTable,
        channel: ClientChannel,
        runtime: AgentService,
        *,
        roots: Sequence[str],
        nursery: trio.Nursery,
        dialect: Callable[[], Dialect],
        forward: SessionEventForward,
    ) -> None:
        self._table = table
        self._channel = channel
        self._runtime = runtime
        self._roots = roots
        self._nursery = nursery
        self._dialect = dialect
        self._forward = forward

    async def attach(
        self, session_id: str, cwd: str, additional: tuple[str, ...], *, resume: bool
    ) -> EdgeSession | None:
        """Follow ``session_id`` if another connection holds it (``None``: nobody does, and
        the caller opens it as usual). Counted under the connection's session cap."""
        table = self._table
        with table.opening():
            found = await self._runtime.observe_task(
                session_id,
                cwd,
                allowed_roots=self._roots,
                additional_directories=additional,
                replace_directories=resume,
            )
        if found is None:
            return None
        lease, observer = found
        features = self._channel.features
        session = EdgeSession(
            lease,
            self._runtime.cached_model_choices(),
            self._dialect(),
            notices=features.notices,
            compaction=features.compaction,
            plans=features.plans,
            observer=observer,
        )
        try:
            table.register(session)
            session.choices = await lease.model_choices()
        except BaseException:
            self._forget(session)
            raise
        logger.info("session %s observed", session.id)
        return session

    def _forget(self, session: EdgeSession) -> None:
        """Detach the window and forget the session here (the holder keeps it)."""
        assert session.observer is not None
        session.observer.detach()
        session.stop_updates()
        if self._table.holds(session):
            self._table.remove(session)

    async def replay_rows(self, session: EdgeSession) -> list[TimelineItem]:
        """The history an observing window is shown: the stored rows, the runs it attached
        during as far as they had been read (each message whole), and none of what its feed
        brings."""
        observer = session.observer
        assert observer is not None
        items = await session.lease.history()
        # Read after the history: a run that started meanwhile is in the feed from its start.
        snapshot = observer.snapshot
        partly = {run.run_id for run in snapshot}
        fed = observer.feed_runs - partly
        rows = [
            item
            for item in items
            if item.run_id not in fed
            and not (item.run_id in partly and item.kind is not ItemKind.USER)
        ]
        rows.extend(item for run in snapshot for item in run.items)
        return rows

    @contextmanager
    def attaching(self, session: EdgeSession) -> Iterator[None]:
        """Around the rest of an observing load or resume: if it fails, the window is
        detached and the session forgotten here; if it succeeds, the window follows once the
        answer is queued."""
        try:
            yield
        except BaseException:
            self._forget(session)
            raise

        async def start() -> None:
            self._nursery.start_soon(self._follow, session)

        after_answer(start)

    async def _follow(self, session: EdgeSession) -> None:
        observer = session.observer
        assert observer is not None
        reason: str | None = None
        gone = False
        try:
            try:
                with session.update_scope():
                    async with trio.open_nursery() as questions:
                        reason = await self._pump(session, questions)
                        questions.cancel_scope.cancel()
            # Raised inside the nursery, a closed connection arrives as a group.
            except* ConnectionClosed:
                gone = True
        except SessionClosed:
            gone = True
        finally:
            observer.detach()
        if gone or reason is None or session.closing or not self._table.holds(session):
            return
        # Told why, then gone for this connection: a later request about it is -32002.
        notice = session.projector.event(
            RunNotice(
                f"{session.id}-detached",
                f"This window no longer follows the session: {reason}.",
                level="warning",
            )
        )
        with (
            contextlib.suppress(ConnectionClosed, OutboundFrameTooLarge, SessionClosed),
            session.update_scope(),
        ):
            await self._send(session, _listed(notice))
        self._forget(session)

    async def _pump(self, session: EdgeSession, questions: trio.Nursery) -> str | None:
        """Project the feed until it ends; the reason it ended (``None``: the window went)."""
        observer = session.observer
        assert observer is not None
        projector = session.projector
        running = {run.run_id for run in observer.snapshot}
        asking: dict[str, _Questions] = {}
        async for item in observer:
            if isinstance(item, RunBatch):
                if item.run_id not in running:
                    running.add(item.run_id)
                    await self._send(session, projector.run_started())
                await self._batch(session, item, asking, questions)
            elif isinstance(item, PromptAdmitted):
                await self._send(
                    session,
                    admitted_message(projector, item.run_id, item.message_id, item.text),
                )
            elif isinstance(item, ObserverDetached):
                return item.reason
            else:
                try:
                    await self._forward(session, item)
                except OutboundFrameTooLarge as exc:
                    logger.info("an update was left out for an observing window: %s", exc)
        return None

    async def _batch(
        self,
        session: EdgeSession,
        batch: RunBatch,
        asking: dict[str, _Questions],
        questions: trio.Nursery,
    ) -> None:
        projector = session.projector
        chunk_kinds = session.dialect.chunk_kinds
        updates: list[Outbound] = []
        for event in batch.events:
            kind = chunk_kinds.get(type(event))
            if kind is not None:
                chunk: Any = event
                line = projector.text_line(kind, chunk.message_id, chunk.text)
                if line is not None:
                    updates.append(line)
                else:
                    updates.extend(projector.text(kind, chunk.message_id, chunk.text))
            elif isinstance(event, PermissionRequest):
                await self._send(session, updates)
                updates = []
                asked = asking.setdefault(batch.run_id, _Questions())
                questions.start_soon(asked.ask, asked.begin(), self._channel, session, event)
            elif isinstance(event, RunEnded):
                await self._send(session, updates)
                updates = []
                ended = asking.pop(batch.run_id, None)
                if ended is not None:
                    await ended.end()
                outcome = event.outcome
                await self._send(session, projector.run_ended(outcome.state, outcome.stop_reason))
            else:
                updates.extend(_listed(projector.event(event)))
        await self._send(session, updates)

    async def _send(self, session: EdgeSession, updates: Sequence[Outbound]) -> None:
        if not updates:
            return
        try:
            await self._channel.send_many(session.id, updates)
        except OutboundFrameTooLarge as exc:
            # Too large for this window alone: the holder's turn goes on.
            logger.info("an update was left out for an observing window: %s", exc)


class _Questions:
    """The permission questions one window is asking about one run: ended with it."""

    def __init__(self) -> None:
        self._scopes: set[trio.CancelScope] = set()
        self._idle = trio.Event()
        self._idle.set()

    def begin(self) -> trio.CancelScope:
        """A new question's scope, counted at once (before its task starts)."""
        scope = trio.CancelScope()
        if not self._scopes:
            self._idle = trio.Event()
        self._scopes.add(scope)
        return scope

    async def ask(
        self,
        scope: trio.CancelScope,
        channel: ClientChannel,
        session: EdgeSession,
        event: PermissionRequest,
    ) -> None:
        try:
            with scope:
                await ask_permission(channel, session, event)
        finally:
            self._scopes.discard(scope)
            if not self._scopes:
                self._idle.set()

    async def end(self) -> None:
        """The run ended: its questions are withdrawn, and over once this returns."""
        for scope in self._scopes:
            scope.cancel()
        await self._idle.wait()


def _listed(update: Outbound | list[bytes] | None) -> list[Outbound]:
    if update is None:
        return []
    if isinstance(update, list):
        return list(update)
    return [update]
