"""Tool permissions: the host's policy, and exact-run responders that fail closed."""

from __future__ import annotations

import enum
import logging
import secrets
from collections.abc import Callable, Collection
from typing import Any, Protocol

import attrs
import trio

from maple_acp.model import ToolCategory

logger = logging.getLogger(__name__)

#: The one static tool through which a lease's external MCP tools are reached. Always ask-before,
#: whatever the policy or a server's metadata says: the servers are supplied by the caller.
EXTERNAL_MCP_TOOL = "external_mcp"


class PermissionAnswer(enum.StrEnum):
    """The only two answers a caller can give; there is no "always"."""

    ALLOW_ONCE = "allow_once"
    DENY_ONCE = "deny_once"


class PermissionClass(enum.Enum):
    #: The host's own classifier covers the request; the run proceeds without asking.
    ALLOW = "allow"
    #: The run's caller decides.
    ASK = "ask"


@attrs.frozen(kw_only=True)
class ToolRequest:
    """A tool call the backend wants to make, as the policy and the caller see it."""

    tool_id: str
    name: str
    title: str = ""
    #: JSON-ready arguments of the call (a file tool's target is its ``path`` key).
    raw_input: Any = None
    #: What a backend's own tool does, for the session's mode; ``None`` = not placed
    #: (``OTHER``). The tools the bundled backends share have a fixed category (see
    #: ``maple_acp.runtime._modes``), whatever this says.
    category: ToolCategory | None = None


class PermissionPolicy(Protocol):
    """Host-supplied classifier of tool requests. ``external_mcp`` is asked whatever this
    returns."""

    def classify(self, request: ToolRequest) -> PermissionClass: ...


@attrs.frozen
class AskForTools:
    """A policy that asks for the named tools and allows every other one."""

    names: frozenset[str]

    def classify(self, request: ToolRequest) -> PermissionClass:
        return PermissionClass.ASK if request.name in self.names else PermissionClass.ALLOW


def classify(policy: PermissionPolicy, request: ToolRequest) -> PermissionClass:
    if request.name == EXTERNAL_MCP_TOOL:
        return PermissionClass.ASK
    return policy.classify(request)


class PermissionResponder:
    """The opaque, single-use handle that answers one permission request of one run."""

    __slots__ = ("_broker", "_pending", "id", "run_id")

    def __init__(self, broker: PermissionBroker, responder_id: str, pending: _Pending) -> None:
        self._broker = broker
        self._pending = pending
        self.id = responder_id
        self.run_id = broker.run_id

    @property
    def done(self) -> trio.Event:
        """Set once the request is resolved, whichever way."""
        return self._pending.done

    @property
    def allowed(self) -> bool:
        return self._pending.allowed

    @property
    def cancelled(self) -> bool:
        """Resolved by the run's end or cancellation (or a client's ``cancelled`` outcome),
        not by a person's answer: the tool was never decided on."""
        return self._pending.cancelled

    def answer(self, answer: PermissionAnswer | None) -> bool:
        """Answer this request. True if the answer was accepted; ``None`` (the caller's answer
        was malformed or never came) and every invalid form (an unknown value, a second
        answer, an answer after the run was cancelled) deny every pending request of the run
        and cancel it, and return False."""
        return self._broker.answer(self.id, answer)

    def __repr__(self) -> str:
        return f"PermissionResponder(run={self.run_id})"


class _Pending:
    __slots__ = ("allowed", "cancelled", "done")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.allowed = False
        self.cancelled = False


class PermissionBroker:
    """Every permission wait of one run. Not shared across runs, so an answer addressed to a
    run can only resolve that run's own requests."""

    def __init__(self, run_id: str, cancel_run: Callable[[], None]) -> None:
        self.run_id = run_id
        self._cancel_run = cancel_run
        self._pending: dict[str, _Pending] = {}
        self._used: set[str] = set()
        self._closed = False

    def open_request(self) -> PermissionResponder:
        responder_id = secrets.token_urlsafe(16)
        pending = self._pending[responder_id] = _Pending()
        return PermissionResponder(self, responder_id, pending)

    async def wait(self, responder: PermissionResponder) -> bool:
        """Wait (in the caller's cancel scope, which is the run's) for the answer. A
        cancellation resolves the request as denied before it propagates."""
        # Held by the responder: the answer may arrive before this wait begins.
        try:
            await responder.done.wait()
            return responder.allowed
        finally:
            if not responder.done.is_set():
                self._resolve(responder.id, allowed=False, cancelled=True)

    def answer(self, responder_id: str, answer: PermissionAnswer | None) -> bool:
        pending = self._pending.get(responder_id)
        valid = (
            not self._closed
            and pending is not None
            and not pending.done.is_set()
            # Checked, not trusted: a host may hand over any value, and only these two are
            # answers.
            and answer in (PermissionAnswer.ALLOW_ONCE, PermissionAnswer.DENY_ONCE)
        )
        if not valid:
            logger.info("fail-closed permission answer for run %s", self.run_id)
            self.fail_closed()
            return False
        self._resolve(responder_id, allowed=answer == PermissionAnswer.ALLOW_ONCE)
        return True

    def fail_closed(self) -> None:
        """Deny every pending request and cancel the run."""
        self.deny_all(cancelled=True)
        self._cancel_run()

    def deny_all(self, *, cancelled: bool = False) -> None:
        for responder_id in list(self._pending):
            self._resolve(responder_id, allowed=False, cancelled=cancelled)

    def close(self) -> None:
        """The run ended or was cancelled: deny what is pending, refuse every later answer."""
        self._closed = True
        self.deny_all(cancelled=True)

    @property
    def pending_ids(self) -> Collection[str]:
        return tuple(self._pending)

    def _resolve(self, responder_id: str, *, allowed: bool, cancelled: bool = False) -> None:
        pending = self._pending.pop(responder_id, None)
        self._used.add(responder_id)
        if pending is None or pending.done.is_set():
            return
        pending.allowed = allowed and not self._closed
        pending.cancelled = cancelled
        pending.done.set()


class SharedQuestion:
    """One permission request asked in several windows (the lease's holder and its observers):
    the first window to answer with allow-once or deny-once decides it; a window that gives up
    (its client's ``cancelled`` outcome, an unknown option, its disconnect) is left out, and
    once every window gave up the request is denied and the run cancelled, as for one window
    that gave up. Each window answers through its own :class:`PermissionTicket`."""

    __slots__ = ("_open", "responder", "settled")

    def __init__(self, responder: PermissionResponder) -> None:
        self.responder = responder
        self._open = 0
        #: Set once a window's answer decided the request.
        self.settled = trio.Event()

    @property
    def request_done(self) -> bool:
        """Decided, or resolved by the run's end or cancellation."""
        return self.settled.is_set() or self.responder.done.is_set()

    def ticket(self) -> PermissionTicket:
        """One more window that may answer."""
        self._open += 1
        return PermissionTicket(self)

    def _answer(self, ticket: PermissionTicket, answer: PermissionAnswer | None) -> bool:
        if ticket.used:
            # A second answer through one ticket is the responder's invalid form: it fails
            # closed (deny, cancel the run), whatever it says and whatever the other windows do.
            self.responder.answer(None)
            return False
        ticket.used = True
        if self.request_done:
            # Another window decided (or the run ended) first: this answer changes nothing.
            return False
        self._open -= 1
        if answer in (PermissionAnswer.ALLOW_ONCE, PermissionAnswer.DENY_ONCE):
            accepted = self.responder.answer(answer)
            self.settled.set()
            return accepted
        if self._open == 0:
            # No window is left to answer: fail closed, as a lone window's failed answer does.
            self.responder.answer(None)
        return False


class PermissionTicket:
    """One window's handle on a :class:`SharedQuestion`, answered once like a
    :class:`PermissionResponder`: a clean answer decides the question if no other window did;
    ``None`` withdraws this window only."""

    __slots__ = ("question", "used")

    def __init__(self, question: SharedQuestion) -> None:
        self.question = question
        self.used = False

    @property
    def id(self) -> str:
        return self.question.responder.id

    @property
    def run_id(self) -> str:
        return self.question.responder.run_id

    @property
    def done(self) -> trio.Event:
        """Set once the request is resolved, whichever way (as the responder's)."""
        return self.question.responder.done

    @property
    def settled(self) -> trio.Event:
        """Set once a window (this one or another) decided the question."""
        return self.question.settled

    @property
    def allowed(self) -> bool:
        return self.question.responder.allowed

    @property
    def cancelled(self) -> bool:
        return self.question.responder.cancelled

    def answer(self, answer: PermissionAnswer | None) -> bool:
        """This window's answer; True if it decided the question. A second answer through
        the same ticket fails closed, as a responder's does."""
        return self.question._answer(self, answer)

    def __repr__(self) -> str:
        return f"PermissionTicket(used={self.used})"
