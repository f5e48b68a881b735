"""One ACP session on one connection: the runtime lease plus what the edge tracks about it.

State rules live here as plain attributes and methods (no I/O), so the connection code only
decides *when* to call them. Only edge concerns are here: one prompt at a time, the queue of
prompts behind it and the operation barrier are the runtime's (``SessionLease.queue_prompt``,
``operation``, ``drain``).

- every task that may send a ``session/update`` for the session runs inside a cancel scope
  registered with :meth:`EdgeSession.update_scope`; :meth:`EdgeSession.stop_updates` cancels
  them all and refuses new ones, which is how "no update after the close response" holds;
- a ``session/cancel`` is ordered against the prompt it cancels by inbound frame index; a
  prompt that arrived after a cancel waits in the runtime's queue for the cancelled turn;
- on v1 a queued prompt's turn starts once the answer of the turn before it is on its way
  (:meth:`EdgeSession.turn_place`), and prompts withdrawn from the queue are answered in
  queue order (:meth:`EdgeSession.withdrawal_place`);
- a request that must wait for a close admitted before it (a load, a resume) waits for
  :meth:`EdgeSession.wait_gone`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

from maple_acp.edge._children import SessionChildren
from maple_acp.edge._dialect import ConfigOptions, Dialect, SessionSettings, config_options
from maple_acp.edge._idempotency import PromptKeys
from maple_acp.runtime import ModelChoices, Observer, SessionLease


class SessionClosed(Exception):
    """The session stopped publishing updates (closed, or its connection ended)."""


@attrs.define
class AnswerPlace:
    """A prompt's place among its session's answers: ``before`` is set once the answer of the
    prompt ahead of it is queued; set ``answered`` once its own is (or it failed)."""

    before: trio.Event
    answered: trio.Event = attrs.field(factory=trio.Event)


class EdgeSession:
    def __init__(
        self,
        lease: SessionLease,
        choices: ModelChoices,
        dialect: Dialect,
        *,
        notices: bool = False,
        compaction: bool = False,
        plans: bool = False,
        boolean_options: bool = False,
        subagents: bool = False,
        observer: Observer | None = None,
    ) -> None:
        self.lease = lease
        self.id = lease.task_id
        #: Set when this connection follows a session another connection holds: ``lease`` is
        #: then the holder's, which this connection never releases; it only detaches.
        self.observer = observer
        #: The protocol version of the connection that opened the session, and its updates
        #: (``notices``: the client shows notice updates; ``compaction``: it follows
        #: compactions; ``plans``: it takes plan operations).
        self.dialect = dialect
        self.projector = dialect.projection(
            self.id, notices=notices, compaction=compaction, plans=plans
        )
        #: The child sessions its runs delegate to, as the client sees them (``subagents``:
        #: it shows them as sessions).
        self.children = SessionChildren(
            self.id,
            dialect,
            visible=subagents,
            notices=notices,
            compaction=compaction,
            plans=plans,
        )
        self.choices = choices
        #: Whether the client takes boolean config options (else they are not offered).
        self.boolean_options = boolean_options
        #: Set once the close started; a second close or any new operation is refused.
        self.closing = False
        self._stopped = False
        self._scopes: set[trio.CancelScope] = set()
        self._abortable: set[trio.CancelScope] = set()
        #: Inbound frame index of the latest ``session/cancel`` for this session: a prompt that
        #: arrived before it is cancelled even if its run did not exist yet.
        self.cancelled_at = 0
        #: Whether the trust question has been settled for this session's first prompt.
        self.trust_settled = False
        #: Set once the answer of the latest prompt to hold the slot is queued (or it
        #: failed): on v1 the next prompt's turn starts after it.
        self._turn_answered = trio.Event()
        self._turn_answered.set()
        #: The answers of prompts withdrawn from the queue, by their order, until the next
        #: one is answered.
        self._withdrawals: dict[int, trio.Event] = {}
        #: Set once the connection no longer holds the session (closed, revoked, ended).
        self._gone = trio.Event()
        #: Keyed prompts (v2's ``idempotencyKey``) not answered yet.
        self.prompt_keys = PromptKeys()

    # -- the prompt ----------------------------------------------------------------------------

    @property
    def model_locked(self) -> bool:
        # The runtime's rule, the one ``set_model`` applies.
        return self.lease.model_locked

    def options(self) -> ConfigOptions:
        """The session's config options (its dialect shows them in its own shape)."""
        return config_options(
            self.choices,
            self.current_model,
            locked=self.model_locked,
            settings=self.settings(),
            booleans=self.boolean_options,
        )

    def settings(self) -> SessionSettings:
        """The session's mode, thinking effort and boolean options as its lease has them
        now."""
        lease = self.lease
        values = lease.option_values
        return SessionSettings(
            modes=lease.modes,
            mode=lease.mode,
            thought_levels=lease.thought_levels,
            thought_level=lease.thought_level,
            boolean_options=tuple((o, values[o.id]) for o in lease.boolean_options),
        )

    @property
    def current_model(self) -> str:
        return self.lease.task.model or self.choices.default

    @contextmanager
    def abortable(self) -> Iterator[trio.CancelScope]:
        """A cancel scope that a close cancels at once: for work before a run exists (the
        trust question), which the run's cancellation cannot reach. Check
        ``cancelled_caught`` after the block."""
        with trio.CancelScope() as scope:
            if self.closing:
                scope.cancel()
            self._abortable.add(scope)
            try:
                yield scope
            finally:
                self._abortable.discard(scope)

    def begin_close(self) -> None:
        self.closing = True
        self._abort()
        # What waits in the queue is withdrawn at once, not run and cancelled one by one.
        self.lease.cancel_queued()

    def cancel_prompt(self, arrival: int) -> None:
        """A ``session/cancel`` arrived as inbound frame ``arrival`` and every request before
        it about the session has decided: it ends the prompt that arrived before it, whatever
        stage that prompt has reached, and withdraws every prompt waiting in the queue (they
        all arrived before it)."""
        self.cancelled_at = arrival
        self._abort()
        # The waiting prompts first, so that the slot the cancelled run frees goes to none.
        self.lease.cancel_queued()
        self.lease.cancel_run()

    def cancelled_since(self, arrival: int) -> bool:
        """Whether a cancel or a close arrived after the prompt that arrived at ``arrival``."""
        return self.closing or self.cancelled_at > arrival

    def turn_place(self) -> AnswerPlace:
        """A prompt holds the session's slot (prompts hold it one after the other): on v1 its
        turn starts once the answer of the prompt that held it before is queued."""
        place = AnswerPlace(self._turn_answered)
        self._turn_answered = place.answered
        return place

    def withdrawal_place(self, order: int) -> AnswerPlace:
        """A prompt was withdrawn from the queue, the ``order``-th of the lease: it is answered
        after the one withdrawn before it (withdrawn prompts are answered in queue order)."""
        events = self._withdrawals
        before = events.setdefault(order - 1, trio.Event())
        if order == 1:
            before.set()
        place = AnswerPlace(before, events.setdefault(order, trio.Event()))
        return place

    def withdrawal_answered(self, order: int) -> None:
        """The ``order``-th withdrawn prompt's answer is queued: the one before it is done
        with."""
        self._withdrawals.pop(order - 1, None)

    def _abort(self) -> None:
        for scope in self._abortable:
            scope.cancel()

    # -- updates -----------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self._stopped

    @contextmanager
    def update_scope(self) -> Iterator[trio.CancelScope]:
        """A cancel scope for work that sends updates of this session. Raises
        :class:`SessionClosed` if updates were already stopped."""
        if self._stopped:
            raise SessionClosed(self.id)
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    def mark_gone(self) -> None:
        """The connection no longer holds the session (the table calls this)."""
        self._gone.set()

    async def wait_gone(self) -> None:
        """Until the connection no longer holds the session: a close bounds this by its own
        deadline."""
        await self._gone.wait()

    def stop_updates(self) -> None:
        """Synchronously end every task sending updates for this session (they are cancelled
        at their next checkpoint, before anything more is queued) and refuse new ones."""
        self._stopped = True
        for scope in self._scopes:
            scope.cancel()
