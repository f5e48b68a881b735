"""A scenario engine for the ACP edge: operations over 2-3 connections to one service, a model
built only from what was observed, and the invariants checked after every settled step.

Time is a ``MockClock`` that never moves on its own: every deadline (the close rule, the
provisional grace period, the sweep) passes only when an ``Advance`` operation jumps it, so a
scenario is a pure function of its operations and of thread timing. "Settled" means every task
is blocked, no worker thread is busy and no child process is alive; the model's predictions are
checked only at settled points, invariants about frame order at every one.

An operation with ``then=None`` is followed by a settle; ``then=N`` starts the next operation
after only N scheduler checkpoints, so the two race inside the service.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import trio
import trio.testing
from edge_harness import Harness, running_service
from test_child_sessions import ChildSessionsSchema

from maple_acp.edge import AcpServiceConfig, HostLifecycle
from maple_acp.rpc import ConnectionClosed
from maple_acp.runtime import PROVISIONAL_SWEEP_INTERVAL_S, SessionLease
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.clock import wait_quiet
from maple_acp.testing.demo import DEMO_ACCOUNT
from maple_acp.testing.schema import AcpSchema, find_schema_dir
from maple_acp.wire import ProtocolError

#: The provisional grace period the runtime is given (virtual seconds).
GRACE_S = 120.0
#: A jump at least this long past a grace expiry guarantees a sweep ran after it.
SWEEP_S = PROVISIONAL_SWEEP_INTERVAL_S
#: The close deadline (the five-second rule, docs/protocol.md).
CLOSE_S = 5.0
OTHER_ACCOUNT = "other-account"
CHAT_MODELS = ("demo-echo", "demo-echo-large")
DEFAULT_MODEL = "demo-echo"
#: Answers a client may give that are not a clean allow/reject: each must fail closed.
MALFORMED_ANSWERS: tuple[Any, ...] = (
    {"outcome": {"outcome": "selected", "optionId": "allow_always"}},
    {"outcome": "allow_once"},
    None,
    {"outcome": {"outcome": "selected"}},
)
#: Requests after which updates for their session may legitimately follow (a replay, a run,
#: the commands that follow a re-attach).
UPDATING_METHODS = ("session/prompt", "session/load", "session/resume")
#: The two methods that attach a lease to an existing task (and re-attach a held one).
ATTACH_METHODS = ("session/load", "session/resume")
RESOURCE_NOT_FOUND = -32002
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
UNKNOWN_TASK = "f" * 32
#: Task indices below this pick a session open on the operation's own connection.
OWN_SESSIONS = 3


# --- operations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Initialize:
    conn: int
    #: Declare ``clientCapabilities.subagents``: sessions opened after it see their children
    #: (announced by id, each cancellable alone).
    subagents: bool = False
    then: int | None = None


@dataclass(frozen=True)
class New:
    conn: int
    then: int | None = None


@dataclass(frozen=True)
class Load:
    conn: int
    task: int
    then: int | None = None


@dataclass(frozen=True)
class Resume:
    """``session/resume``: a load without the replay (same admission and re-attach rules)."""

    conn: int
    task: int
    then: int | None = None


@dataclass(frozen=True)
class Delete:
    conn: int
    task: int
    then: int | None = None


@dataclass(frozen=True)
class Prompt:
    conn: int
    task: int
    script: str  # "echo" | "hang" | "tool" | "delegate" (a child that hangs)
    answer: str = "allow"  # "allow" | "reject" | "cancel" | "malformed" | "deferred"
    then: int | None = None


@dataclass(frozen=True)
class Cancel:
    conn: int
    task: int
    then: int | None = None


@dataclass(frozen=True)
class CancelChild:
    """``session/cancel`` naming the child its session's connection was last told of (the
    running one if any): the child alone ends, cancelled, and the delegating turn goes on to
    end its turn. Without a child announced on the connection, nothing is sent."""

    conn: int
    task: int
    then: int | None = None


@dataclass(frozen=True)
class Close:
    conn: int
    task: int
    then: int | None = None


@dataclass(frozen=True)
class CloseThenOpen:
    """``session/close`` and then a load (or resume) of the same session, written back to
    back in one write: the open waits for the close to finish, then decides."""

    conn: int
    task: int
    method: str = "session/load"  # or "session/resume"
    then: int | None = None


@dataclass(frozen=True)
class CancelThenPrompt:
    """``session/cancel`` and then a prompt for the same session, written back to back in one
    write: the cancel ends only the turn written before it; the prompt runs once that turn
    ended."""

    conn: int
    task: int
    script: str = "echo"
    then: int | None = None


@dataclass(frozen=True)
class QueueClear:
    """``_session/queue`` ``clear``: every prompt waiting behind the session's running turn is
    withdrawn (answered cancelled; its turn never runs)."""

    conn: int
    task: int
    then: int | None = None


@dataclass(frozen=True)
class SetModel:
    conn: int
    task: int
    model: str
    then: int | None = None


@dataclass(frozen=True)
class AnswerLate:
    """Answer every deferred permission request of a connection with allow."""

    conn: int
    then: int | None = None


@dataclass(frozen=True)
class List:
    conn: int
    then: int | None = None


@dataclass(frozen=True)
class Disconnect:
    conn: int
    then: int | None = None


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class SwitchAccount:
    how: str  # "lifecycle" | "bare"


@dataclass(frozen=True)
class StopRuntime:
    how: str  # "lifecycle" | "drain"


Op = (
    Initialize
    | New
    | Load
    | Resume
    | Delete
    | Prompt
    | Cancel
    | CancelChild
    | Close
    | CloseThenOpen
    | CancelThenPrompt
    | QueueClear
    | SetModel
    | AnswerLate
    | List
    | Disconnect
    | Advance
    | SwitchAccount
    | StopRuntime
)


#: A ``session/cancel`` issued right after a prompt (without settling) may reach the wire
#: first: the prompt's request goes out from a task of its own. Such a cancel targets nothing
#: and the prompt runs on, so the model cannot require it to end that prompt. (A cancel that
#: reaches the wire after the prompt always ends it, at any stage; see
#: tests/edge/test_methods.py::test_cancel_right_behind_the_prompt_ends_it.)
CANCEL_BEFORE_RUN = "cancel-before-run"


def _refused_before_close(call: Call) -> bool:
    """Whether the edge refused a delete of its own session before closing it (a run going)."""
    error = call.error
    return isinstance(error, ProtocolError) and "run going" in error.message


def _frame(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message}) + b"\n"


class Violation(AssertionError):
    """An invariant or a prediction of the model did not hold."""


# --- the model --------------------------------------------------------------------------------


@dataclass
class Call:
    conn: int
    method: str
    params: Any
    issued: int
    settled_before: bool
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    completed: int = -1
    applied: bool = False
    #: The operation that issued it did not settle before the next one began.
    raced: bool = False
    issued_time: float = field(default_factory=trio.current_time)
    completed_time: float = 0.0
    #: The account signed in (as the model knows it) when it was issued.
    account: str = ""


@dataclass
class OpenSession:
    task: str
    created_here: bool
    prompt: PromptRecord | None = None
    #: Tick at which the request that opened it (new, load, resume) was issued.
    opened_by: int = 0


@dataclass
class PromptRecord:
    number: int
    conn: int
    task: str
    script: str
    answer: str
    call: Call
    asked: bool = False
    #: Clock of the client's allow answer, if it gave one.
    allowed_at: int | None = None
    #: Clock of the first thing that must stop the run (cancel, close, disconnect, revoke).
    stopped_at: int | None = None
    #: How many settles had happened when it was sent.
    epoch: int = 0
    #: A session/cancel reached it while it ran with nothing else in flight.
    cancelled_alone: bool = False
    #: Written right after a cancel of its session, in the same write: that cancel is not
    #: its own, so it must run (never refused because the cancelled turn is still ending).
    after_cancel: bool = False
    #: Its running child was cancelled alone (by id) while it ran with nothing else in
    #: flight: the child must end cancelled, and the turn go on to end ``end_turn``.
    child_cancelled: str | None = None

    @property
    def marker(self) -> str:
        return f"marker-{self.number}"


@dataclass
class TaskModel:
    id: str
    account: str
    creator: int
    model: str = DEFAULT_MODEL
    prompted: bool = False
    maybe_prompted: bool = False
    deleted: bool = False
    #: Whether the task still exists is not known (a prompt raced a release).
    unsure: bool = False
    #: Virtual time at which an untouched provisional task's grace ends.
    grace_until: float | None = None
    #: Tick at which a ``session/delete`` of it was answered with success.
    removed_at: int | None = None
    #: A delete of it got no answer (its connection ended first): it may be gone or not.
    maybe_deleted: bool = False


@dataclass
class Connection:
    slot: int
    client: AcpTestClient | None = None
    alive: bool = False
    stop: trio.Event = field(default_factory=trio.Event)
    finished: trio.Event = field(default_factory=trio.Event)
    nursery: trio.Nursery | None = None
    sessions: dict[str, OpenSession] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    deferred: list[tuple[PromptRecord, trio.Event]] = field(default_factory=list)
    tombstones: set[str] = field(default_factory=set)


_SCHEMA: list[AcpSchema | None] = []


def acp_schema() -> AcpSchema | None:
    """The v1 schema, reading the child shapes (sent to a client that declared
    ``subagents``) from its unstable file."""
    if not _SCHEMA:
        directory = find_schema_dir()
        _SCHEMA.append(ChildSessionsSchema(directory) if directory is not None else None)
    return _SCHEMA[0]


class Scenario:
    def __init__(
        self,
        harness: Harness,
        root: Path,
        clock: trio.testing.MockClock,
        tolerate: frozenset[str] = frozenset(),
    ) -> None:
        self.tolerate = tolerate
        self.epoch = 0
        self.harness = harness
        self.runtime = harness.runtime
        self.acp = harness.acp
        self.project = root / "project"
        self.clock = clock
        self.conns: dict[int, Connection] = {}
        self.history: list[Connection] = []
        self.tasks: list[TaskModel] = []
        self.by_id: dict[str, TaskModel] = {}
        self.prompts: list[PromptRecord] = []
        self.account = DEMO_ACCOUNT
        self.drained = False
        self.tick = 0
        self.settled = True
        self._pending_stop: list[tuple[str, Call]] = []
        #: Every lease seen at a settled point (by identity), with its task's id: one that
        #: ended must have no child running.
        self._leases: dict[int, tuple[str, SessionLease]] = {}
        self.nursery: trio.Nursery

    # -- plumbing ------------------------------------------------------------------------------

    def _next(self) -> int:
        self.tick += 1
        return self.tick

    async def settle(self) -> None:
        """Until every task is blocked with no worker thread busy and no child alive."""
        await wait_quiet()

    def task_id(self, index: int) -> str:
        """The index-th known task (creation order), or an id nobody issued."""
        if not self.tasks:
            return UNKNOWN_TASK
        return self.tasks[index % len(self.tasks)].id

    def target(self, conn: Connection, index: int) -> str:
        """A session to act on: below :data:`OWN_SESSIONS`, one open on ``conn`` (if any);
        otherwise any known task, wherever it is held."""
        if index < OWN_SESSIONS and conn.sessions:
            own = list(conn.sessions)
            return own[index % len(own)]
        return self.task_id(index)

    async def connection(self, slot: int) -> Connection:
        conn = self.conns.get(slot)
        if conn is not None and conn.alive:
            return conn
        conn = Connection(slot)
        self.conns[slot] = conn
        self.history.append(conn)
        await self.nursery.start(self._serve_connection, conn)
        return conn

    async def _serve_connection(
        self, conn: Connection, *, task_status: trio.TaskStatus[None]
    ) -> None:
        async def permission(params: Any) -> Any:
            return await self._answer_permission(conn, params)

        try:
            async with self.harness.connect(permission=permission) as client:
                conn.client = client
                conn.alive = True
                async with trio.open_nursery() as calls:
                    conn.nursery = calls
                    task_status.started()
                    await conn.stop.wait()
                    calls.cancel_scope.cancel()
        finally:
            conn.finished.set()

    async def _answer_permission(self, conn: Connection, params: Any) -> Any:
        command = params.get("toolCall", {}).get("rawInput", {}).get("command", "")
        number = int(command.rsplit("-", 1)[-1])
        record = self.prompts[number]
        record.asked = True
        if record.answer == "allow":
            record.allowed_at = self._next()
            return "allow"
        if record.answer == "reject":
            return "reject"
        if record.answer == "cancel":
            return "cancel"
        if record.answer == "malformed":
            return MALFORMED_ANSWERS[number % len(MALFORMED_ANSWERS)]
        release = trio.Event()
        conn.deferred.append((record, release))
        await release.wait()
        record.allowed_at = self._next()
        return "allow"

    def _issue(self, conn: Connection, method: str, params: Any) -> Call:
        call = Call(conn.slot, method, params, self._next(), self.settled, account=self.account)
        conn.calls.append(call)

        async def run() -> None:
            assert conn.client is not None
            try:
                call.result = await conn.client.call(method, params)
            except (ProtocolError, ConnectionClosed) as exc:
                call.error = exc
            call.done = True
            call.completed = self._next()
            call.completed_time = trio.current_time()

        assert conn.nursery is not None
        conn.nursery.start_soon(run)
        return call

    def _issue_together(self, conn: Connection, lines: list[tuple[str, Any]]) -> list[Call]:
        """Write ``lines`` (``(method, params)``; a ``None`` params' method is a notification
        with ``{"sessionId": ...}`` given as the method's second item) in one write, so the
        service reads them back to back; one :class:`Call` per request, in order."""
        assert conn.client is not None
        client = conn.client
        raw: list[bytes] = []
        calls: list[tuple[Call, str]] = []
        for method, params in lines:
            if method == "session/cancel":
                raw.append(_frame({"method": method, "params": params}))
                continue
            msg_id = f"t{self._next()}"
            call = Call(conn.slot, method, params, self.tick, self.settled, account=self.account)
            conn.calls.append(call)
            calls.append((call, msg_id))
            raw.append(_frame({"id": msg_id, "method": method, "params": params}))

        async def answer(call: Call, msg_id: str) -> None:
            def found() -> Any:
                return next(
                    (
                        f.message
                        for f in client.frames
                        if f.direction == "in"
                        and isinstance(f.message, dict)
                        and "method" not in f.message
                        and f.message.get("id") == msg_id
                    ),
                    None,
                )

            await client.wait_until(lambda: found() is not None)
            message = found()
            if "error" in message:
                error = message["error"]
                call.error = ProtocolError(error["code"], error["message"])
            else:
                call.result = message["result"]
            call.done = True
            call.completed = self._next()
            call.completed_time = trio.current_time()

        assert conn.nursery is not None
        # Started before the write: an answer cannot arrive before its waiter looks.
        for call, msg_id in calls:
            conn.nursery.start_soon(answer, call, msg_id)
        conn.nursery.start_soon(client.peer.notify_lines, raw)
        return [call for call, _ in calls]

    # -- operations ----------------------------------------------------------------------------

    async def run(self, ops: list[Op]) -> None:
        for op in ops:
            first = {id(c) for conn in self.history for c in conn.calls}
            await self.apply(op)
            then = getattr(op, "then", None)
            if then is not None:
                for conn in self.history:
                    for call in conn.calls:
                        if id(call) not in first:
                            call.raced = True
            if then is None:
                await self.settle()
                self.epoch += 1
                await self.check()
                self.settled = True
            else:
                self.settled = False
                for _ in range(then):
                    await trio.lowlevel.checkpoint()
        await self.settle()
        await self.check()
        self.settled = True
        await self.finish()

    async def apply(self, op: Op) -> None:
        if isinstance(op, Advance):
            # Settle first, so that every release the model timed happened before the jump.
            await self.settle()
            self.clock.jump(op.seconds)
            return
        if isinstance(op, SwitchAccount):
            await self._switch_account(op.how)
            return
        if isinstance(op, StopRuntime):
            await self._stop_runtime(op.how)
            return
        if isinstance(op, Disconnect):
            self._disconnect(op.conn)
            return
        conn = await self.connection(op.conn)
        if isinstance(op, Initialize):
            capabilities = {"subagents": {}} if op.subagents else {}
            params = {"protocolVersion": 1, "clientCapabilities": capabilities}
            self._issue(conn, "initialize", params)
        elif isinstance(op, New):
            self._issue(conn, "session/new", {"cwd": str(self.project), "mcpServers": []})
        elif isinstance(op, Load | Resume):
            # Small indices pick a session this connection holds: a re-attach.
            params = {"sessionId": self.target(conn, op.task), "cwd": str(self.project)}
            method = "session/load" if isinstance(op, Load) else "session/resume"
            self._issue(conn, method, {**params, "mcpServers": []})
        elif isinstance(op, Delete):
            self._issue(conn, "session/delete", {"sessionId": self.target(conn, op.task)})
        elif isinstance(op, Prompt):
            self._prompt(conn, op)
        elif isinstance(op, Cancel):
            task = self.target(conn, op.task)
            self._cancel_model(conn, task)
            assert conn.client is not None
            await conn.client.cancel(task)
        elif isinstance(op, CancelChild):
            task = self.target(conn, op.task)
            child = self._announced_child(conn, task)
            if child is not None:
                self._cancel_child_model(conn, task, child)
                assert conn.client is not None
                await conn.client.cancel(child)
        elif isinstance(op, Close):
            task = self.target(conn, op.task)
            session = conn.sessions.pop(task, None)
            call = self._issue(conn, "session/close", {"sessionId": task})
            if session is not None:
                call.params = {"sessionId": task, "_closing": session}
                if session.prompt is not None:
                    session.prompt.stopped_at = session.prompt.stopped_at or call.issued
        elif isinstance(op, CloseThenOpen):
            task = self.target(conn, op.task)
            session = conn.sessions.pop(task, None)
            params = {"sessionId": task, "cwd": str(self.project), "mcpServers": []}
            close, _opened = self._issue_together(
                conn, [("session/close", {"sessionId": task}), (op.method, params)]
            )
            if session is not None:
                close.params = {"sessionId": task, "_closing": session}
                if session.prompt is not None:
                    session.prompt.stopped_at = session.prompt.stopped_at or close.issued
        elif isinstance(op, CancelThenPrompt):
            task = self.target(conn, op.task)
            self._cancel_model(conn, task)
            self._prompt(conn, Prompt(op.conn, op.task, op.script), task=task, after_cancel=True)
        elif isinstance(op, QueueClear):
            task = self.target(conn, op.task)
            self._withdraw_model(conn, task)
            self._issue(conn, "_session/queue", {"sessionId": task, "action": "clear"})
        elif isinstance(op, SetModel):
            params = {
                "sessionId": self.target(conn, op.task),
                "configId": "model",
                "value": op.model,
            }
            self._issue(conn, "session/set_config_option", params)
        elif isinstance(op, AnswerLate):
            for _record, release in conn.deferred:
                release.set()
            conn.deferred.clear()
        elif isinstance(op, List):
            self._issue(conn, "session/list", {})

    def _waiting(self, conn: Connection, task: str) -> list[PromptRecord]:
        """The prompts of ``task`` on ``conn`` that wait in its queue as the model knows it:
        unanswered, sent in an earlier step than now, behind the session's running prompt."""
        session = conn.sessions.get(task)
        if session is None or session.prompt is None:
            return []
        return [
            p
            for p in self.prompts
            if p.task == task
            and p.conn == conn.slot
            and p is not session.prompt
            and p.number > session.prompt.number
            and not p.call.done
        ]

    def _withdraw_model(self, conn: Connection, task: str) -> None:
        """The model's side of withdrawing the prompts waiting in ``task``'s queue: one sent
        and settled before now must be answered cancelled, and its turn never runs."""
        tick = self._next()
        for record in self._waiting(conn, task):
            if record.epoch != self.epoch and self.settled:
                record.cancelled_alone = True
            record.stopped_at = record.stopped_at or tick

    def _cancel_model(self, conn: Connection, task: str) -> None:
        """The model's side of a ``session/cancel`` of ``task`` on ``conn``."""
        self._withdraw_model(conn, task)
        tick = self._next()
        session = conn.sessions.get(task)
        record = session.prompt if session is not None else None
        early = record is not None and record.epoch == self.epoch
        if early and CANCEL_BEFORE_RUN in self.tolerate:
            pass  # it may have reached the wire before the prompt
        elif record is not None:
            if record.stopped_at is None and not early and self.settled:
                # The prompt was running, alone: this cancel must end it as cancelled.
                record.cancelled_alone = True
            record.stopped_at = record.stopped_at or tick

    def _children_seen(self, conn: Connection, parent: str) -> dict[str, dict[str, Any]]:
        """The children of ``parent`` this connection was told of, in announcement order,
        each with the latest state its parent's ``subagent_update`` frames gave it."""
        seen: dict[str, dict[str, Any]] = {}
        assert conn.client is not None
        for frame in conn.client.frames:
            message = frame.message
            if frame.direction != "in" or not isinstance(message, dict):
                continue
            if message.get("method") != "session/update":
                continue
            params = message.get("params") or {}
            update = params.get("update") or {}
            if params.get("sessionId") != parent or update.get("sessionUpdate") != (
                "subagent_update"
            ):
                continue
            state = seen.setdefault(update["sessionId"], {})
            if "state" in update:
                # A state patch replaces the child's state whole.
                state.clear()
                state.update(update["state"])
        return seen

    def _announced_child(self, conn: Connection, parent: str) -> str | None:
        """The child of ``parent`` to cancel: the last announced that is not idle, else the
        last announced (a cancel of an ended child must change nothing)."""
        seen = self._children_seen(conn, parent)
        running = [child for child, state in seen.items() if state.get("state") != "idle"]
        if running:
            return running[-1]
        return list(seen)[-1] if seen else None

    def _cancel_child_model(self, conn: Connection, task: str, child: str) -> None:
        """The model's side of a ``session/cancel`` naming ``child``, a child of ``task``."""
        session = conn.sessions.get(task)
        record = session.prompt if session is not None else None
        state = self._children_seen(conn, task)[child].get("state")
        if (
            record is not None
            and record.script == "delegate"
            and record.stopped_at is None
            and record.epoch != self.epoch
            and self.settled
            and state != "idle"
        ):
            # The session's delegating turn was running alone, waiting on this child.
            record.child_cancelled = child

    def _prompt(
        self, conn: Connection, op: Prompt, *, task: str | None = None, after_cancel: bool = False
    ) -> None:
        task = self.target(conn, op.task) if task is None else task
        number = len(self.prompts)
        if op.script == "echo":
            text = f"/echo reply-{number}"
        elif op.script == "hang":
            text = "/hang"
        elif op.script == "delegate":
            # The parent waits in its delegation for a child that waits to be cancelled.
            text = f"/delegate child-{number} :: /hang"
        else:
            text = f'/tool shell {{"command": "touch marker-{number}"}}'
        params = {"sessionId": task, "prompt": [{"type": "text", "text": text}]}
        if after_cancel:
            # The cancel (the model's side is done) and the prompt, in one write.
            (call,) = self._issue_together(
                conn, [("session/cancel", {"sessionId": task}), ("session/prompt", params)]
            )
        else:
            call = self._issue(conn, "session/prompt", params)
        record = PromptRecord(
            number,
            conn.slot,
            task,
            op.script,
            op.answer,
            call,
            epoch=self.epoch,
            after_cancel=after_cancel,
        )
        self.prompts.append(record)
        model = self.by_id.get(task)
        # Only a prompt on a session this connection holds (or may hold: a load still in
        # flight) can admit a message; any other is refused before ownership.
        loading = any(
            not c.applied and c.method in ATTACH_METHODS and c.params.get("sessionId") == task
            for c in conn.calls
        )
        if model is not None and (task in conn.sessions or loading):
            model.maybe_prompted = True
        session = conn.sessions.get(task)
        if session is not None and session.prompt is None:
            session.prompt = record

    def _disconnect(self, slot: int) -> None:
        conn = self.conns.get(slot)
        if conn is None or not conn.alive:
            return
        self._end_connection(conn)
        conn.stop.set()

    def _end_connection(self, conn: Connection) -> None:
        """The model's side of a disconnect (issued now; its leases are released soon)."""
        tick = self._next()
        conn.alive = False
        for call in conn.calls:
            if call.method == "session/delete" and not call.done:
                self._maybe_deleted(call)
        for session in conn.sessions.values():
            if session.prompt is not None:
                session.prompt.stopped_at = session.prompt.stopped_at or tick
            self._released(session, close=False)
        conn.sessions.clear()

    def _ending(self, conn: Connection, task_id: str) -> bool:
        """Whether ``conn`` has a close or delete of ``task_id`` not yet applied."""
        return any(
            not c.applied
            and c.method in ("session/close", "session/delete")
            and c.params.get("sessionId") == task_id
            for c in conn.calls
        )

    def _maybe_deleted(self, call: Call) -> None:
        task = self.by_id.get(call.params["sessionId"])
        if task is not None and task.removed_at is None:
            task.maybe_deleted = True

    def _settle_maybe_deleted(self, task: TaskModel | None, call: Call) -> bool:
        """Learn from an answer about a task whose deletion is unknown; True if the answer
        can be checked against nothing else."""
        if task is None or not task.maybe_deleted:
            return False
        if isinstance(call.error, ConnectionClosed):
            return True
        if call.error is not None and self._code(call) == RESOURCE_NOT_FOUND:
            task.maybe_deleted = False
            task.deleted = True
            task.removed_at = call.completed
        elif call.error is None:
            task.maybe_deleted = False
        return True

    def _released(self, session: OpenSession, *, close: bool, at: float | None = None) -> None:
        """Model the end of a lease; ``at`` is when it happened (default: now)."""
        task = self.by_id[session.task]
        if task.deleted:
            return
        if task.maybe_prompted and not task.prompted:
            # A prompt that raced this release may or may not have admitted its message.
            task.unsure = True
            return
        if task.maybe_prompted:
            return
        if close:
            # A close ends an untouched task, whether this connection created or loaded it.
            task.deleted = True
        else:
            task.grace_until = (trio.current_time() if at is None else at) + GRACE_S

    async def _switch_account(self, how: str) -> None:
        target = OTHER_ACCOUNT if self.account == DEMO_ACCOUNT else DEMO_ACCOUNT
        if how == "lifecycle":
            for conn in list(self.conns.values()):
                if conn.alive:
                    self._end_connection(conn)
            self.account = target
            await self._background_stop("switch", HostLifecycle(self.runtime, self.acp), target)
        else:
            # The runtime revokes every lease; each connection forgets its sessions (they end
            # as on a disconnect) and stays open.
            tick = self._next()
            for conn in self.conns.values():
                for session in conn.sessions.values():
                    if session.prompt is not None:
                        session.prompt.stopped_at = session.prompt.stopped_at or tick
                    self._released(session, close=False)
                conn.sessions.clear()
            self.account = target
            self.runtime.sign_in(target)

    async def _stop_runtime(self, how: str) -> None:
        if self.drained:
            return
        self.drained = True
        tick = self._next()
        for conn in self.conns.values():
            for session in conn.sessions.values():
                if session.prompt is not None:
                    session.prompt.stopped_at = session.prompt.stopped_at or tick
        if how == "lifecycle":
            for conn in list(self.conns.values()):
                if conn.alive:
                    self._end_connection(conn)
            await self._background_stop("shutdown", HostLifecycle(self.runtime, self.acp), None)
        else:
            self.nursery.start_soon(self.runtime.drain)

    async def _background_stop(
        self, kind: str, lifecycle: HostLifecycle, target: str | None
    ) -> None:
        call = Call(-1, kind, target, self._next(), self.settled)

        async def run() -> None:
            if kind == "switch":
                assert target is not None
                report = await lifecycle.switch_account(target)
            else:
                report = await lifecycle.shutdown()
            call.result = report
            call.done = True
            call.completed = self._next()
            # The service ended every connection; let the client sides go too.
            for conn in self.conns.values():
                conn.stop.set()

        self._pending_stop.append((kind, call))
        self.nursery.start_soon(run)

    # -- checks --------------------------------------------------------------------------------

    async def check(self) -> None:
        self._apply_completions()
        self._check_stops()
        for conn in self.history:
            self._check_frames(conn)
            if conn.alive:
                self._check_answered(conn)
            elif not conn.finished.is_set():
                raise Violation(
                    f"connection {conn.slot}: its disconnect did not finish while no virtual "
                    "time passed"
                )
        self._check_markers()
        await self._check_leases()
        await self._check_store()

    def _check_stops(self) -> None:
        for kind, call in self._pending_stop:
            if not call.done:
                raise Violation(f"{kind} did not finish while no virtual time passed")
            report = call.result
            if not report.ok:
                raise Violation(f"{kind} reported a failure: {report!r}")
        self._pending_stop.clear()

    def _apply_completions(self) -> None:
        done = [c for conn in self.history for c in conn.calls if c.done and not c.applied]
        for call in sorted(done, key=lambda c: c.completed):
            call.applied = True
            self._apply(call)

    def _code(self, call: Call) -> int | None:
        error = call.error
        return error.code if isinstance(error, ProtocolError) else None

    def _expect(self, call: Call, ok: bool | None, code: int | None = None, why: str = "") -> None:
        """Predictions hold only for a call issued and answered with no race around it."""
        if not call.settled_before or call.raced or isinstance(call.error, ConnectionClosed):
            return
        if ok is True and call.error is not None:
            raise Violation(f"{call.method} {call.params!r} failed: {call.error!r} ({why})")
        if ok is False and call.error is None:
            raise Violation(f"{call.method} {call.params!r} succeeded: {call.result!r} ({why})")
        if ok is False and code is not None and self._code(call) != code:
            raise Violation(
                f"{call.method} {call.params!r}: expected error {code}, got {call.error!r} ({why})"
            )

    def _holder(self, task: str) -> tuple[Connection, OpenSession] | None:
        for conn in self.conns.values():
            session = conn.sessions.get(task)
            if session is not None:
                return conn, session
        return None

    def _apply(self, call: Call) -> None:
        conn = next(c for c in self.history if c.slot == call.conn and call in c.calls)
        method = call.method
        if method == "initialize":
            self._expect(call, True)
            if call.error is None and call.result.get("protocolVersion") != 1:
                raise Violation(f"initialize answered {call.result!r}")
        elif method == "session/new":
            self._expect(call, not self.drained, why="new while serving")
            if call.error is None:
                task_id = call.result["sessionId"]
                if task_id in self.by_id:
                    raise Violation(f"session/new returned a known id {task_id}")
                model = TaskModel(task_id, self.account, conn.slot)
                self.tasks.append(model)
                self.by_id[task_id] = model
                if conn.alive:
                    conn.sessions[task_id] = OpenSession(
                        task_id, created_here=True, opened_by=call.issued
                    )
                else:
                    self._released(OpenSession(task_id, created_here=True), close=False)
        elif method in ATTACH_METHODS:
            self._apply_load(conn, call)
        elif method == "session/delete":
            self._apply_delete(conn, call)
        elif method == "session/prompt":
            self._apply_prompt(conn, call)
        elif method == "session/close":
            self._apply_close(conn, call)
        elif method == "session/set_config_option":
            self._apply_set_model(conn, call)
        elif method == "session/list":
            self._apply_list(call)
        elif method == "_session/queue":
            held = call.params["sessionId"] in conn.sessions
            self._expect(call, held, RESOURCE_NOT_FOUND, "clear the queue of a session")
            if call.error is None and call.result != {}:
                raise Violation(f"_session/queue clear answered {call.result!r}")

    def _apply_load(self, conn: Connection, call: Call) -> None:
        task_id = call.params["sessionId"]
        task = self.by_id.get(task_id)
        holder = self._holder(task_id)
        if self._settle_maybe_deleted(task, call) and call.error is not None:
            return
        if (
            task is not None
            and task.unsure
            and self._holder(task_id) is None
            and call.settled_before
            and not call.raced
            and task.account == self.account
            and not self.drained
        ):
            # Learn from the answer what the model could not predict.
            task.unsure = False
            if call.error is not None and self._code(call) == RESOURCE_NOT_FOUND:
                task.deleted = True
                return
        if call.error is None:
            if holder is not None and holder[0] is not conn:
                raise Violation(
                    f"task {task_id} loaded on connection {conn.slot} while connection "
                    f"{holder[0].slot} held it"
                )
            if task is None or task.deleted:
                raise Violation(f"a deleted or unknown task {task_id} was loaded")
            if holder is not None:
                # A re-attach: the same lease, the same session.
                if holder[1].prompt is not None and call.settled_before and not call.raced:
                    raise Violation(f"task {task_id} re-attached while its prompt ran")
                return
            if conn.alive:
                conn.sessions[task_id] = OpenSession(
                    task_id, created_here=False, opened_by=call.issued
                )
                task.grace_until = None
            else:
                self._released(OpenSession(task_id, created_here=False), close=False)
            return
        # In the order the edge and then the runtime check them.
        if task_id in conn.tombstones:
            self._expect(call, False, INVALID_REQUEST, "closing tombstone")
        elif holder is not None and holder[0] is conn:
            if self.drained:
                self._expect(call, False, why="drained")
            elif holder[1].prompt is not None:
                self._expect(call, False, INVALID_REQUEST, "re-attach while a prompt runs")
            else:
                self._expect(call, True, why="re-attach on the holding connection")
        elif self.drained:
            self._expect(call, False, why="drained")
        elif task is None:
            self._expect(call, False, RESOURCE_NOT_FOUND, "unknown task")
        elif task.deleted:
            self._expect(call, False, RESOURCE_NOT_FOUND, "deleted task")
        elif task.account != self.account:
            self._expect(call, False, RESOURCE_NOT_FOUND, "another account's task")
        elif holder is not None:
            self._expect(call, False, INVALID_REQUEST, "held by another connection")
        elif task.grace_until is not None and trio.current_time() >= task.grace_until:
            return  # the sweep may or may not have taken it yet
        else:
            self._expect(call, True, why="a free task of the account")

    def _apply_prompt(self, conn: Connection, call: Call) -> None:
        record = next(p for p in self.prompts if p.call is call)
        task = self.by_id.get(record.task)
        session = conn.sessions.get(record.task)
        if session is not None and session.prompt is record:
            # A prompt sent while this one ran may have been admitted once it ended: it is
            # the session's running prompt now (if it was refused, it is answered too).
            session.prompt = next(
                (
                    p
                    for p in self.prompts
                    if p.task == record.task and p.conn == conn.slot and not p.call.done
                ),
                None,
            )
        if call.error is None:
            reason = call.result.get("stopReason")
            if reason == "end_turn" and task is not None:
                task.prompted = True
            if record.cancelled_alone and reason != "cancelled":
                raise Violation(f"prompt {record} answered {reason!r} after a cancel")
            if record.child_cancelled is not None and record.stopped_at is None:
                self._check_child_cancelled(conn, record, reason)
            if not call.settled_before or call.raced or record.stopped_at is not None:
                return
            expected = {
                "echo": "end_turn",
                "tool": {"allow": "end_turn", "reject": "end_turn"}.get(record.answer, "cancelled"),
            }.get(record.script)
            if record.script == "tool" and record.answer == "deferred":
                expected = "end_turn"  # answered allow later, with nothing stopping the run
            if expected is not None and reason != expected:
                raise Violation(f"prompt {record} answered {reason!r}, expected {expected!r}")
            return
        if session is None:
            self._expect(call, False, RESOURCE_NOT_FOUND, "not open on this connection")
        elif record.after_cancel and not self.drained:
            # Written right after a cancel: the turn that cancel ended is not its own.
            self._expect(call, True, why="a prompt written after a cancel runs")

    def _check_child_cancelled(self, conn: Connection, record: PromptRecord, reason: Any) -> None:
        """A turn whose child alone was cancelled goes on: told the child was cancelled, it
        ends its turn, and the child ended cancelled."""
        if reason != "end_turn":
            raise Violation(f"prompt {record} answered {reason!r} after its child was cancelled")
        child = record.child_cancelled
        assert child is not None
        state = self._children_seen(conn, record.task).get(child, {})
        if state != {"state": "idle", "stopReason": "cancelled"}:
            raise Violation(f"child {child} of prompt {record} ended as {state!r}, not cancelled")

    def _apply_delete(self, conn: Connection, call: Call) -> None:
        task_id = call.params["sessionId"]
        task = self.by_id.get(task_id)
        holder = self._holder(task_id)
        if isinstance(call.error, ConnectionClosed):
            self._maybe_deleted(call)
            return
        if task is not None and task.maybe_deleted and call.error is not None:
            self._settle_maybe_deleted(task, call)
            return
        if call.error is None:
            if task is None or task.removed_at is not None or task.account != self.account:
                return  # delete is idempotent: {} for an id the account does not have
            if holder is not None and holder[0] is not conn:
                if not self._ending(holder[0], task_id):
                    raise Violation(
                        f"task {task_id} deleted while connection {holder[0].slot} held it"
                    )
                # Its close (or delete) released the lease before this delete came.
                released = holder[0].sessions.pop(task_id)
                if released.prompt is not None:
                    released.prompt.stopped_at = released.prompt.stopped_at or call.completed
                holder = None
            if holder is not None:
                session = conn.sessions.pop(task_id)
                if session.prompt is not None:
                    session.prompt.stopped_at = session.prompt.stopped_at or call.completed
            task.deleted = True
            task.unsure = False
            task.grace_until = None
            task.removed_at = call.completed
            return
        if holder is not None and holder[0] is conn and not _refused_before_close(call):
            # The edge closed its own session first (the close rules), then the runtime
            # refused the deletion: the session ended all the same.
            session = conn.sessions.pop(task_id)
            if session.prompt is not None:
                session.prompt.stopped_at = session.prompt.stopped_at or call.completed
            self._released(session, close=True, at=call.completed_time)
        if self.drained:
            self._expect(call, False, why="drained")
        elif task is None or task.removed_at is not None or task.account != self.account:
            self._expect(call, True, why="unknown, deleted or another account's: {}")
        elif task_id in conn.tombstones:
            self._expect(call, False, INVALID_REQUEST, "its close is still cleaning up")
        elif holder is not None and holder[0] is not conn:
            self._expect(call, False, INVALID_REQUEST, "held by another connection")
        elif holder is not None and holder[1].prompt is not None:
            self._expect(call, False, INVALID_REQUEST, "a prompt runs in it")
        elif task.deleted or task.unsure:
            return  # a close or the sweep may have taken it
        elif task.grace_until is not None and trio.current_time() >= task.grace_until:
            return  # the sweep may or may not have taken it yet
        else:
            self._expect(call, True, why="a task of the account nobody else holds")

    def _apply_close(self, conn: Connection, call: Call) -> None:
        session: OpenSession | None = call.params.get("_closing")
        task_id = call.params["sessionId"]
        late = conn.sessions.get(task_id)
        if call.error is None and late is not None and (late.opened_by < call.issued or call.raced):
            # A load or resume issued before this close answered after it was issued (or one
            # issued right after it, racing it, reached the wire first): the service
            # registered its session before the close looked, so this close ended it.
            del conn.sessions[task_id]
            if session is None:
                session = late
        if session is None:
            self._expect(call, False, RESOURCE_NOT_FOUND, "close of a session not open here")
            return
        if call.error is None:
            if call.completed_time - call.issued_time >= CLOSE_S:
                # The close missed its deadline: the session id stays a tombstone here.
                conn.tombstones.add(session.task)
            self._released(session, close=True, at=call.completed_time)
        else:
            # A close racing a revocation may find the session already gone.
            self._expect(call, self.drained or None, why="close of an open session")

    def _apply_set_model(self, conn: Connection, call: Call) -> None:
        task_id = call.params["sessionId"]
        value = call.params["value"]
        session = conn.sessions.get(task_id)
        task = self.by_id.get(task_id)
        if session is None or task is None:
            self._expect(call, False, RESOURCE_NOT_FOUND, "not open on this connection")
            return
        if self.drained:
            self._expect(call, False, why="drained")
            return
        if value not in CHAT_MODELS:
            self._expect(call, False, INVALID_PARAMS, "not a chat model")
        elif task.prompted and value != task.model:
            self._expect(call, False, INVALID_PARAMS, "model locked after the first prompt")
        elif not task.maybe_prompted or value == task.model:
            self._expect(call, True, why="model selectable before the first prompt")
        if call.error is None:
            options = {o["id"]: o for o in call.result["configOptions"]}
            if options["model"]["currentValue"] != value:
                raise Violation(f"set_config_option answered {options['model']!r}")
            task.model = value

    def _apply_list(self, call: Call) -> None:
        self._expect(call, not self.drained, why="list while serving, refused once drained")
        if call.error is not None:
            return
        listed = {s["sessionId"] for s in call.result["sessions"]}
        # A list written before an account switch may be answered for either account.
        mine = {t.id for t in self.tasks if t.account in (self.account, call.account)}
        surely = {t.id for t in self.tasks if t.prompted and t.account == self.account}
        maybe = {t.id for t in self.tasks if t.maybe_prompted}
        if listed - mine:
            raise Violation(f"session/list showed tasks not of the account: {listed - mine}")
        if listed - maybe:
            raise Violation(f"session/list showed never-prompted tasks: {listed - maybe}")
        removed = {
            t.id for t in self.tasks if t.removed_at is not None and t.removed_at < call.issued
        }
        if listed & removed:
            raise Violation(f"session/list showed deleted tasks: {listed & removed}")
        surely -= {t.id for t in self.tasks if t.removed_at is not None or t.maybe_deleted}
        if call.settled_before and not call.raced and surely - listed:
            raise Violation(f"session/list hid prompted tasks: {surely - listed}")

    # -- frame invariants ----------------------------------------------------------------------

    def _check_frames(self, conn: Connection) -> None:
        if conn.client is None:
            return
        sent: dict[Any, tuple[str, Any]] = {}
        answered: dict[Any, int] = {}
        # Session id -> index of the answer after which nothing more may come for it.
        quiet: dict[str, tuple[int, str]] = {}
        # Session id -> prompts sent and not yet answered.
        prompting: dict[str, int] = {}
        # Parent session id -> the children announced on it -> whether the last state
        # patch said idle.
        children: dict[str, dict[str, bool]] = {}
        for index, frame in enumerate(conn.client.frames):
            message = frame.message
            if not isinstance(message, dict):
                raise Violation(f"connection {conn.slot}: an unparsable frame {frame.raw[:200]!r}")
            if frame.direction == "out":
                if "method" in message and "id" in message:
                    sent[message["id"]] = (message["method"], message.get("params"))
                    params = message.get("params") or {}
                    if message["method"] in UPDATING_METHODS:
                        quiet.pop(str(params.get("sessionId")), None)
                        target = str(params.get("sessionId"))
                        prompting[target] = prompting.get(target, 0) + 1
                continue
            if "method" in message:
                params = message.get("params") or {}
                sid = params.get("sessionId")
                if sid in quiet:
                    at, why = quiet[sid]
                    raise Violation(
                        f"connection {conn.slot}: {message['method']} for session {sid} at frame "
                        f"{index} after its {why} at frame {at}: {message!r}"
                    )
                update = params.get("update") or {}
                if update.get("sessionUpdate") == "subagent_update":
                    ended = children.setdefault(str(sid), {})
                    child = update["sessionId"]
                    if "state" in update:
                        ended[child] = update["state"].get("state") == "idle"
                    else:
                        ended.setdefault(child, False)  # the announcement
                continue
            msg_id = message.get("id")
            if msg_id not in sent:
                raise Violation(f"connection {conn.slot}: an answer to unknown id {msg_id!r}")
            answered[msg_id] = answered.get(msg_id, 0) + 1
            if answered[msg_id] > 1:
                raise Violation(f"connection {conn.slot}: request {msg_id} answered twice")
            method, params = sent[msg_id]
            sid = str((params or {}).get("sessionId"))
            if method in UPDATING_METHODS:
                prompting[sid] -= 1
            # A refused second prompt says nothing about the first, still running, and a load
            # in flight replays history: quiet holds only once neither is in flight.
            if prompting.get(sid):
                continue
            if method == "session/prompt":
                quiet[sid] = (index, "prompt answer")
                # No child outlives the turn that delegated to it (nor its cancel).
                running = [child for child, ended in children.get(sid, {}).items() if not ended]
                if running:
                    raise Violation(
                        f"connection {conn.slot}: session {sid}'s prompt answered at frame "
                        f"{index} with its children {running} not reported idle"
                    )
            elif method == "session/close" and "result" in message:
                quiet[sid] = (index, "close answer")
            elif method == "session/delete" and "result" in message:
                quiet[sid] = (index, "delete answer")

    def _check_answered(self, conn: Connection) -> None:
        """On a live connection, only a prompt that may legitimately run on is unanswered."""
        for call in conn.calls:
            if call.done:
                continue
            record = next((p for p in self.prompts if p.call is call), None)
            if record is None:
                raise Violation(f"connection {conn.slot}: {call.method} {call.params!r} unanswered")
            session = conn.sessions.get(record.task)
            may_run = (
                session is not None
                and not self.drained
                and record.stopped_at is None
                and (
                    record.script == "hang"
                    # A delegating turn waits on its child until the child is cancelled.
                    or (record.script == "delegate" and record.child_cancelled is None)
                    or (
                        record.script == "tool"
                        and record.answer == "deferred"
                        and record.allowed_at is None
                    )
                    # It waits in the session's queue behind a turn that runs on (sent
                    # before it, or racing it to the wire).
                    or any(
                        p.task == record.task
                        and p.conn == conn.slot
                        and p is not record
                        and (p.number < record.number or record.call.raced)
                        and not p.call.done
                        for p in self.prompts
                    )
                )
            )
            if not may_run:
                raise Violation(f"connection {conn.slot}: prompt {record} never answered")

    def _check_markers(self) -> None:
        for record in self.prompts:
            if record.script != "tool":
                continue
            exists = (self.project / record.marker).exists()
            if not exists:
                if (
                    record.call.done
                    and record.call.error is None
                    and record.call.result.get("stopReason") == "end_turn"
                    and record.allowed_at is not None
                ):
                    raise Violation(
                        f"prompt {record} ended its turn but the allowed tool never ran"
                    )
                continue
            if record.allowed_at is None:
                raise Violation(f"the tool of prompt {record} ran without an allow answer")
            if record.stopped_at is not None and record.stopped_at < record.allowed_at:
                raise Violation(f"the tool of prompt {record} ran on an allow given after a stop")

    async def _check_leases(self) -> None:
        for task in self.tasks:
            holders = [c.slot for c in self.conns.values() if c.alive and task.id in c.sessions]
            if len(holders) > 1:
                raise Violation(f"task {task.id} is open on connections {holders} at once")
            lease = self.runtime.lease_of(task.id)
            holder = self._holder(task.id)
            closing = any(
                not c.done and c.method == "session/close" and c.params.get("sessionId") == task.id
                for conn in self.history
                for c in conn.calls
            )
            if lease is not None and lease.running_children and lease.active_run is None:
                raise Violation(
                    f"task {task.id} has children running outside a run: {lease.running_children}"
                )
            if lease is not None:
                self._leases[id(lease)] = (task.id, lease)
            if holder is None:
                if lease is not None and not closing:
                    raise Violation(f"task {task.id} is still leased with no session open")
                continue
            if lease is None or lease.revoked:
                if self.drained:
                    continue  # a drain may end sessions on its own
                raise Violation(
                    f"task {task.id} is open on connection {holder[0].slot} with lease {lease!r}"
                )
        for task_id, seen in self._leases.values():
            if seen is not self.runtime.lease_of(task_id) and seen.running_children:
                raise Violation(
                    f"a lease of task {task_id} ended with children running: "
                    f"{seen.running_children}"
                )
        status = self.acp.status()
        live = sum(1 for conn in self.conns.values() if conn.alive)
        if status.connections != live:
            raise Violation(f"the service counts {status.connections} connections, not {live}")

    async def _check_store(self) -> None:
        now = trio.current_time()
        for task in self.tasks:
            row = await self.runtime.store.get_task(task.id)
            if task.removed_at is not None:
                if row is not None:
                    raise Violation(f"deleted task {task.id} came back: {row!r}")
                continue
            if task.maybe_deleted:
                continue
            if task.prompted:
                if row is None or row.provisional:
                    raise Violation(f"prompted task {task.id} is gone or provisional: {row!r}")
                continue
            if task.maybe_prompted:
                continue
            if task.deleted:
                if row is not None:
                    raise Violation(f"task {task.id} closed untouched by its creator still exists")
                continue
            if self._holder(task.id) is not None:
                if row is None or not row.provisional:
                    raise Violation(f"held untouched task {task.id} is gone or not provisional")
                continue
            if task.grace_until is not None:
                if now < task.grace_until and row is None:
                    raise Violation(f"task {task.id} deleted before its grace period ended")
                if now >= task.grace_until + SWEEP_S and row is not None:
                    raise Violation(f"task {task.id} outlived its grace period: {row!r}")

    # -- the end -------------------------------------------------------------------------------

    async def finish(self) -> None:
        """Stop everything in order, then check what must hold once it all ended."""
        for conn in list(self.conns.values()):
            if not conn.alive:
                continue
            assert conn.client is not None
            for task in list(conn.sessions):
                # It ends the running turn and withdraws the prompts waiting behind it.
                self._cancel_model(conn, task)
                await conn.client.cancel(task)
        await self.settle()
        await self.check()
        for conn in list(self.conns.values()):
            if conn.alive:
                for _ in range(len(conn.sessions)):
                    await self.apply(Close(conn.slot, 0))
        await self.settle()
        await self.check()
        for conn in list(self.conns.values()):
            self._disconnect(conn.slot)
        await self.settle()
        await self.check()
        status = self.runtime.status()
        if status.leases or status.active_runs:
            raise Violation(f"after every connection ended the runtime holds {status!r}")
        if not self.drained and self.account == DEMO_ACCOUNT:
            conn = await self.connection(0)
            call = self._issue(conn, "session/list", {})
            await self.settle()
            await self.check()
            if call.error is not None:
                raise Violation(f"the final session/list failed: {call.error!r}")
            self._disconnect(0)
            await self.settle()
        schema = acp_schema()
        if schema is not None:
            for conn in self.history:
                if conn.client is not None:
                    conn.client.validate(schema)
        self.clock.jump(GRACE_S + SWEEP_S + 1)
        await self.settle()
        await self._check_store()
        for model in self.tasks:
            row = await self.runtime.store.get_task(model.id)
            if model.removed_at is not None or model.maybe_deleted:
                continue  # _check_store saw it stay gone, or cannot know
            if model.prompted and row is None:
                raise Violation(f"prompted task {model.id} did not survive")
            if not model.maybe_prompted and row is not None:
                raise Violation(
                    f"untouched provisional task {model.id} outlived its grace: {row!r}"
                )


@contextmanager
def scenario_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="edge-machine-") as directory:
        root = Path(directory)
        (root / "project").mkdir()
        yield root


def run_scenario(ops: list[Op], *, tolerate: frozenset[str] = frozenset()) -> None:
    """Run ``ops`` against a fresh runtime and service; raise :class:`Violation` on a
    broken invariant. ``tolerate`` names known findings the model accepts for now."""
    clock = trio.testing.MockClock()

    async def main(root: Path) -> None:
        async with (
            running_service(
                root,
                config=AcpServiceConfig(allow_session_delete=True),
                provisional_grace_s=GRACE_S,
            ) as harness,
            trio.open_nursery() as nursery,
        ):
            scenario = Scenario(harness, root, clock, tolerate)
            scenario.nursery = nursery
            await scenario.run(ops)
            nursery.cancel_scope.cancel()

    with scenario_dir() as root:
        trio.run(main, root, clock=clock)
