"""The library's promises, checked from what ACP clients saw: a model of answers and leases
ready for a host's own property tests.

- every request is answered once, and only a request the client sent;
- nothing about a session comes after its turn's answer (v1: a prompt's answer ends its turn)
  or its close's answer, until the client sends a request that may update it again (a
  prompt, a load, a resume); the prompt queue's notification may follow a turn's answer (it
  tells the queue, which the turn's end changed), never a close's;
- a closed session's id is refused: a request about it written after the close was answered
  (and before a load or resume of it) gets an error;
- a disconnect releases the connection's leases within :data:`LEASE_RELEASE_BOUND_S`.

:func:`check_frames` checks one client's frames; :class:`AcpLedger` follows every connection of
one service (a :class:`~maple_acp.testing.service.HarnessConnection` each)::

    ledger = AcpLedger(harness.runtime)
    connection = ledger.watch(await harness.open_connection(initialize=True))
    ...
    ledger.check()                      # after every step
    await ledger.disconnect(connection)  # disconnects, and checks the release
    ledger.check(complete=True)         # at the end, once every turn ended

A violation is an :class:`InvariantViolation` (an ``AssertionError``) naming the frame.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import trio

from maple_acp.runtime import AgentService
from maple_acp.testing.client import Frame
from maple_acp.testing.service import HarnessConnection

__all__ = [
    "LEASE_RELEASE_BOUND_S",
    "AcpLedger",
    "InvariantViolation",
    "check_frames",
    "held_sessions",
]

#: The disconnect promise: every lease of the connection is released within five seconds.
LEASE_RELEASE_BOUND_S: Final = 5.0
#: How often (virtual seconds) a disconnect's release is looked at while it is awaited.
RELEASE_POLL_S: Final = 0.1
#: Requests after which updates about their session may come again (a turn, a replay).
UPDATING_METHODS: Final = frozenset({"session/prompt", "session/load", "session/resume"})
#: Requests that reopen a session (what ends "this id is closed").
REOPENING_METHODS: Final = frozenset({"session/load", "session/resume"})
#: Why a session is quiet after a v1 prompt's answer.
PROMPT_ANSWERED: Final = "prompt's answer"
#: The prompt queue's notification: about the queue, not a turn.
QUEUE_CHANGED_METHOD: Final = "_session/queue_changed"
#: Requests about a session that must be refused once it is closed.
REFUSED_WHEN_CLOSED: Final = frozenset(
    {"session/prompt", "session/set_mode", "session/set_config_option", "session/close"}
)


class InvariantViolation(AssertionError):
    """A promise of the library did not hold."""


def _messages(frame: Frame) -> list[Any]:
    message = frame.message
    return message if isinstance(message, list) else [message]


def _session_of(params: Any) -> str | None:
    if isinstance(params, dict) and isinstance(params.get("sessionId"), str):
        return str(params["sessionId"])
    return None


def check_frames(frames: Sequence[Frame], *, complete: bool = False) -> None:
    """Check one connection's frames (``AcpTestClient.frames``) against the promises in the
    module docstring; with ``complete``, also that every request has its answer (call it
    once every turn ended)."""
    sent: dict[Any, tuple[str, str | None]] = {}
    answered: set[Any] = set()
    # Session id -> (frame index, what) after which nothing more may come for it.
    quiet: dict[str, tuple[int, str]] = {}
    # Session id -> updating requests sent and not answered.
    in_flight: dict[str, int] = {}
    closed: set[str] = set()
    # Session id -> loads or resumes sent and not answered (a request behind one waits for it).
    reopening: dict[str, int] = {}
    must_fail: set[Any] = set()
    version = 1
    for index, frame in enumerate(frames):
        for message in _messages(frame):
            if not isinstance(message, dict):
                raise InvariantViolation(f"frame {index} is not a JSON-RPC message: {frame.raw!r}")
            if frame.direction == "out":
                if "method" not in message or "id" not in message:
                    continue
                method, sid = message["method"], _session_of(message.get("params"))
                sent[message["id"]] = (method, sid)
                if sid is None:
                    continue
                if method in UPDATING_METHODS:
                    quiet.pop(sid, None)
                    in_flight[sid] = in_flight.get(sid, 0) + 1
                if method in REOPENING_METHODS:
                    reopening[sid] = reopening.get(sid, 0) + 1
                elif method in REFUSED_WHEN_CLOSED and sid in closed and not reopening.get(sid):
                    must_fail.add(message["id"])
                continue
            if "method" in message:
                sid = _session_of(message.get("params"))
                if sid is not None and sid in quiet:
                    at, why = quiet[sid]
                    if message["method"] == QUEUE_CHANGED_METHOD and why == PROMPT_ANSWERED:
                        continue
                    raise InvariantViolation(
                        f"frame {index}: {message['method']} for session {sid} after its "
                        f"{why} at frame {at}"
                    )
                continue
            msg_id = message.get("id")
            if msg_id not in sent:
                raise InvariantViolation(f"frame {index}: an answer to unknown id {msg_id!r}")
            if msg_id in answered:
                raise InvariantViolation(f"frame {index}: request {msg_id!r} answered twice")
            answered.add(msg_id)
            method, sid = sent[msg_id]
            ok = "result" in message
            if msg_id in must_fail and ok:
                raise InvariantViolation(
                    f"frame {index}: {method} of session {sid}, written after its close was "
                    "answered, succeeded"
                )
            if method == "initialize" and ok:
                version = int(message["result"].get("protocolVersion", 1))
            if sid is None:
                continue
            if method in UPDATING_METHODS:
                in_flight[sid] -= 1
            if method in REOPENING_METHODS:
                reopening[sid] -= 1
                if ok:
                    closed.discard(sid)
            elif method == "session/close" and ok:
                closed.add(sid)
            # A second prompt's answer says nothing of the first (it may wait behind it, or be
            # refused), and a load in flight replays history: quiet holds only once none is
            # in flight.
            if in_flight.get(sid):
                continue
            if method == "session/prompt" and version == 1:
                quiet[sid] = (index, PROMPT_ANSWERED)
            elif method in ("session/close", "session/delete") and ok:
                quiet[sid] = (index, f"{method.removeprefix('session/')}'s answer")
    if complete:
        missing = [f"{sent[i][0]} {i!r}" for i in sent if i not in answered]
        if missing:
            raise InvariantViolation(f"requests never answered: {', '.join(missing)}")


def held_sessions(frames: Iterable[Frame]) -> set[str]:
    """The sessions a connection holds by what its client saw: opened (new, load, resume)
    and not closed or deleted since."""
    sent: dict[Any, tuple[str, str | None]] = {}
    held: set[str] = set()
    for frame in frames:
        for message in _messages(frame):
            if not isinstance(message, dict):
                continue
            if frame.direction == "out":
                if "method" in message and "id" in message:
                    sent[message["id"]] = (message["method"], _session_of(message.get("params")))
                continue
            if "result" not in message or message.get("id") not in sent:
                continue
            method, sid = sent[message["id"]]
            if method == "session/new":
                sid = _session_of(message["result"])
            if sid is None:
                continue
            if method in ("session/new", *REOPENING_METHODS):
                held.add(sid)
            elif method in ("session/close", "session/delete"):
                held.discard(sid)
    return held


class AcpLedger:
    """Every connection of one service, and the promises about them (module docstring)."""

    def __init__(self, runtime: AgentService) -> None:
        self.runtime = runtime
        self.connections: list[HarnessConnection] = []

    def watch(self, connection: HarnessConnection) -> HarnessConnection:
        """Check ``connection`` from now on; returns it."""
        self.connections.append(connection)
        return connection

    def check(self, *, complete: bool = False) -> None:
        """Check every watched connection's frames (see :func:`check_frames`; ``complete``
        applies to live connections: a disconnected one never hears its last answers)."""
        for connection in self.connections:
            check_frames(connection.client.frames, complete=complete and connection.alive)

    async def disconnect(self, connection: HarnessConnection) -> None:
        """Disconnect ``connection`` and check that every lease it held is released within
        :data:`LEASE_RELEASE_BOUND_S` (virtual time: run it under a clock that moves, such
        as a step of ``TrioDriver`` or ``MockClock(autojump_threshold=0)``)."""
        others: set[str] = set()
        for other in self.connections:
            if other is not connection and other.alive:
                others |= held_sessions(other.client.frames)
        held = held_sessions(connection.client.frames) - others
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.disconnect)
            with trio.move_on_after(LEASE_RELEASE_BOUND_S):
                # Polled: watching must not release anything itself, and a lease offers no
                # event to wait on without asking for its release.
                while any(self.runtime.lease_of(sid) is not None for sid in held):  # noqa: ASYNC110
                    await trio.sleep(RELEASE_POLL_S)
            kept = sorted(sid for sid in held if self.runtime.lease_of(sid) is not None)
            if kept:
                raise InvariantViolation(
                    f"{len(kept)} lease(s) still held {LEASE_RELEASE_BOUND_S:.0f} s after "
                    f"their connection ended: {', '.join(kept)}"
                )
