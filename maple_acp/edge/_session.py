"""One ACP session on one connection: the runtime lease plus what the edge tracks about it.

State rules live here as plain attributes and methods (no I/O), so the connection code only
decides *when* to call them. Only edge concerns are here: one prompt at a time and the
operation barrier are the runtime's (``SessionLease.claim_prompt``, ``operation``, ``drain``).

- every task that may send a ``session/update`` for the session runs inside a cancel scope
  registered with :meth:`EdgeSession.update_scope`; :meth:`EdgeSession.stop_updates` cancels
  them all and refuses new ones, which is how "no update after the close response" holds;
- a ``session/cancel`` is ordered against the prompt it cancels by inbound frame index, and a
  prompt that arrived after a cancel waits for the cancelled turn to end instead of meeting it
  (:meth:`EdgeSession.after_cancelled_turn`);
- a request that must wait for a close admitted before it (a load, a resume) waits for
  :meth:`EdgeSession.wait_gone`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

from maple_acp.edge._dialect import ConfigOptions, Dialect, SessionSettings, config_options
from maple_acp.edge._idempotency import PromptKeys
from maple_acp.runtime import ModelChoices, Observer, SessionLease


class SessionClosed(Exception):
    """The session stopped publishing updates (closed, or its connection ended)."""


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
        self.choices = choices
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
        #: The prompt holding the session's turn: its arrival, and an event set once its
        #: answer is queued (or it failed).
        self._turn: tuple[int, trio.Event] | None = None
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
            self.choices, self.current_model, locked=self.model_locked, settings=self.settings()
        )

    def settings(self) -> SessionSettings:
        """The session's mode and thinking effort as its lease has them now."""
        lease = self.lease
        return SessionSettings(
            modes=lease.modes,
            mode=lease.mode,
            thought_levels=lease.thought_levels,
            thought_level=lease.thought_level,
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

    def cancel_prompt(self, arrival: int) -> None:
        """A ``session/cancel`` arrived as inbound frame ``arrival``: it ends the prompt that
        arrived before it, whatever stage that prompt has reached."""
        self.cancelled_at = arrival
        self._abort()
        self.lease.cancel_run()

    def cancelled_since(self, arrival: int) -> bool:
        """Whether a cancel or a close arrived after the prompt that arrived at ``arrival``."""
        return self.closing or self.cancelled_at > arrival

    def begin_turn(self, arrival: int) -> trio.Event:
        """The prompt that arrived at ``arrival`` holds the turn; set the returned event (or
        call :meth:`end_turn`) once its answer is queued."""
        ended = trio.Event()
        self._turn = (arrival, ended)
        return ended

    def end_turn(self, ended: trio.Event) -> None:
        ended.set()
        if self._turn is not None and self._turn[1] is ended:
            self._turn = None

    async def after_cancelled_turn(self, arrival: int) -> None:
        """Wait until no turn holds the session that a cancel written before the prompt that
        arrived at ``arrival`` has cancelled: that prompt is not cancelled by it, and runs
        once the cancelled turn ended (a turn nobody cancelled is not waited for). The
        caller bounds the wait."""
        while self._turn is not None:
            started, ended = self._turn
            if not started < self.cancelled_at < arrival:
                return
            await ended.wait()

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
