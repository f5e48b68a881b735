"""The sessions one connection holds: the only owner of that state (sans-I/O).

:class:`SessionTable` keeps the live sessions by id, the closing tombstones (a close that
missed its deadline keeps its session id from being republished until the connection ends),
whether the client finished sending (``ended``), and the session cap with the opens still
being set up. Flows ask it and tell it; nothing else writes these.

Resource handling: none of its own; :meth:`SessionTable.revoke_all` revokes the leases it
holds synchronously (their release is the closer's). Error handling: a refusal is a
``ProtocolError`` (``-32600`` over the cap or after the client finished sending, ``-32002``
for a session this connection does not hold). Cancellation: no checkpoints anywhere, so a
registration can never be split from the open it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from maple_acp.edge._children import SessionChildren
from maple_acp.edge._errors import unknown_session
from maple_acp.edge._session import EdgeSession
from maple_acp.runtime import SessionLease
from maple_acp.wire import INVALID_REQUEST, ProtocolError

#: Sessions one connection may hold: releasing them all when the connection
#: ends must fit the five-second cleanup bound without stalling other connections.
MAX_SESSIONS_PER_CONNECTION: Final = 256


class SessionTable:
    """See the module docstring. ``cap`` is the host's sessions-per-connection limit."""

    def __init__(self, cap: int = MAX_SESSIONS_PER_CONNECTION) -> None:
        self._cap = cap
        self._sessions: dict[str, EdgeSession] = {}
        self._tombstones: set[str] = set()
        #: Opens admitted under the cap whose lease is still being set up.
        self._opening = 0
        self._ended = False

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> EdgeSession | None:
        """The session ``session_id`` held here, closing or not."""
        return self._sessions.get(session_id)

    def live(self, session_id: str) -> EdgeSession:
        """The live (not closing) session ``session_id``, or ``-32002``."""
        session = self._sessions.get(session_id)
        if session is None or session.closing:
            raise unknown_session()
        return session

    def holds(self, session: EdgeSession) -> bool:
        """Whether ``session`` itself (not a later one with its id) is still held here."""
        return self._sessions.get(session.id) is session

    def ids(self) -> tuple[str, ...]:
        """The ids of the sessions held here, closing ones included, in the order opened."""
        return tuple(self._sessions)

    def children(self) -> list[tuple[SessionChildren, SessionLease]]:
        """Each live session's children as its client sees them, with its lease."""
        return [(session.children, session.lease) for session in self._sessions.values()]

    def is_tombstoned(self, session_id: str) -> bool:
        return session_id in self._tombstones

    @property
    def active_runs(self) -> int:
        """Runs of the sessions this connection holds (an observed session's run is its
        holder's)."""
        return sum(
            1
            for s in self._sessions.values()
            if s.observer is None and s.lease.active_run is not None
        )

    # -- opening -----------------------------------------------------------------------------

    @contextmanager
    def opening(self) -> Iterator[None]:
        """Hold a place under the cap while a lease is set up: ``-32600`` if one more session
        would exceed it. Opens still being set up count, so concurrent requests cannot
        overshoot. Call :meth:`register` right after the block, with no checkpoint between."""
        if len(self._sessions) + self._opening >= self._cap:
            raise ProtocolError(
                INVALID_REQUEST,
                f"this connection already holds {self._cap} sessions; close some first",
            )
        self._opening += 1
        try:
            yield
        finally:
            self._opening -= 1

    def register(self, session: EdgeSession) -> None:
        """Hold ``session`` (from here on a disconnect revokes it). Set up after the client
        finished sending, it is revoked like every other session and ``-32600`` answers the
        open that made it."""
        self._sessions[session.id] = session
        if self._ended:
            self.revoke_all()
            raise ProtocolError(
                INVALID_REQUEST, "the connection is ending: the client finished sending"
            )

    # -- ending ------------------------------------------------------------------------------

    def remove(self, session: EdgeSession, *, tombstone: bool = False) -> None:
        """Forget ``session``; with ``tombstone`` its id stays refused until the connection
        ends (a close that missed its deadline: cleanup goes on in the background)."""
        del self._sessions[session.id]
        if tombstone:
            self._tombstones.add(session.id)
        session.mark_gone()

    def take_all(self) -> list[EdgeSession]:
        """Every session, removed from the table (the connection ended)."""
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            session.mark_gone()
        return sessions

    @property
    def ended(self) -> bool:
        """The client finished sending: sessions set up from now on are revoked at once."""
        return self._ended

    def end(self) -> None:
        """The client finished sending: that is a disconnect, so every capability goes now."""
        self._ended = True
        self.revoke_all()

    def revoke_all(self) -> None:
        """Stop every session's updates and revoke its lease, synchronously; a session this
        connection only observes is detached (its holder keeps the lease)."""
        for session in self._sessions.values():
            session.stop_updates()
            if session.observer is not None:
                session.observer.detach()
            else:
                session.lease.revoke("the connection ended")
