"""An ACP client for tests: drives a service over any Trio stream and records every frame.

Use it against :meth:`maple_acp.edge.AcpService.serve_stream` with a memory stream pair, or
against a real Unix socket or a connector subprocess's stdio::

    async with open_acp_client(stream) as client:
        await client.initialize()
        session_id = (await client.new_session("/path/to/project"))["sessionId"]
        answer = await client.prompt(session_id, "/echo hello")
        assert answer["stopReason"] == "end_turn"
        assert client.text(session_id) == "hello"
        client.validate(AcpSchema(find_schema_dir()))  # every frame the agent sent

Permission requests and elicitations are answered by policies (see :data:`PermissionPolicy`);
every one is recorded, and so is every update, in arrival order.

Given a ``schema`` (``open_acp_client(stream, schema=load_acp_schema())``), the client checks
every frame the agent sends against it as it arrives: the first violation is kept in
:attr:`AcpTestClient.violation` and raised by :meth:`AcpTestClient.check` and when the block
ends normally, so a test never forgets to look.

A request answered with an error raises :class:`maple_acp.wire.ProtocolError` (``.code``,
``.message``) from :meth:`AcpTestClient.call`; once the connection ended, a request still
waiting (or a new one) raises :class:`maple_acp.rpc.ConnectionClosed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import orjson
import trio

from maple_acp.rpc import JsonRpcPeer, method_not_found
from maple_acp.testing.schema import AcpSchema, SchemaViolation, validate_frames

#: Answers one ``session/request_permission`` (its params) with the response object. The
#: strings ``"allow"``, ``"reject"`` and ``"cancel"`` are accepted as shorthands.
PermissionPolicy = Callable[[Mapping[str, Any]], "Awaitable[Any] | Any"]
#: Answers one ``elicitation/create`` (its params) with the response object.
ElicitationPolicy = Callable[[Mapping[str, Any]], "Awaitable[Any] | Any"]


def allow(params: Mapping[str, Any]) -> str:
    return "allow"


def reject(params: Mapping[str, Any]) -> str:
    return "reject"


def _option_for(params: Mapping[str, Any], kind: str) -> str:
    for option in params.get("options", []):
        if option.get("kind") == kind:
            return str(option["optionId"])
    raise AssertionError(f"the permission request offers no {kind} option: {params!r}")


def _permission_answer(params: Mapping[str, Any], decision: Any) -> Any:
    if decision == "allow":
        return {"outcome": {"outcome": "selected", "optionId": _option_for(params, "allow_once")}}
    if decision == "reject":
        return {"outcome": {"outcome": "selected", "optionId": _option_for(params, "reject_once")}}
    if decision == "cancel":
        return {"outcome": {"outcome": "cancelled"}}
    return decision


class HeldPermissions:
    """A permission policy that holds every ``session/request_permission`` until the test
    answers it: for tests whose steps decide when (and how) a question is answered::

        held = HeldPermissions()
        async with open_acp_client(stream, permission=held) as client:
            ...
            held.answer_next("allow")  # or "reject", "cancel", any answer object

    A question still waiting when the connection ends is dropped with it (the agent fails it
    closed)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[Mapping[str, Any], trio.Event, list[Any]]] = []
        self._asked = trio.Event()

    @property
    def pending(self) -> int:
        """Questions asked and not answered yet."""
        return len(self._waiting)

    async def wait_pending(self, count: int = 1) -> None:
        """Until at least ``count`` questions wait for an answer."""
        while len(self._waiting) < count:
            await self._asked.wait()

    def answer_next(self, decision: Any) -> Mapping[str, Any]:
        """Answer the oldest waiting question with ``decision``; return its params."""
        params, answered, slot = self._waiting.pop(0)
        slot.append(decision)
        answered.set()
        return params

    async def __call__(self, params: Mapping[str, Any]) -> Any:
        answered = trio.Event()
        slot: list[Any] = []
        entry = (params, answered, slot)
        self._waiting.append(entry)
        self._asked.set()
        self._asked = trio.Event()
        try:
            await answered.wait()
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)
        return slot[0]


@attrs.define
class Frame:
    """One recorded line: ``message`` is the parsed JSON, or ``None`` if it did not parse."""

    direction: str  # "in" (from the agent) or "out" (to the agent)
    raw: bytes
    message: Any


class _RecordingStream(trio.abc.HalfCloseableStream):
    def __init__(
        self,
        inner: trio.abc.Stream,
        frames: list[Frame],
        changed: Callable[[], None],
        arrived: Callable[[Frame], None] | None = None,
    ) -> None:
        self._inner = inner
        self._frames = frames
        self._changed = changed
        self._arrived = arrived
        self._partial = {"in": b"", "out": b""}

    def _record(self, direction: str, data: bytes) -> None:
        # A plain split with no cap: a test may send a line over the service's cap on purpose.
        *lines, self._partial[direction] = (self._partial[direction] + data).split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if not line.strip():
                continue
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                message = None
            frame = Frame(direction, line, message)
            self._frames.append(frame)
            if self._arrived is not None:
                self._arrived(frame)
        self._changed()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._record("out", bytes(data))
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        self._record("in", bytes(data))
        return data

    async def send_eof(self) -> None:
        if isinstance(self._inner, trio.abc.HalfCloseableStream):
            await self._inner.send_eof()

    async def aclose(self) -> None:
        await self._inner.aclose()


class AcpTestClient:
    """See the module docstring. Build it with :func:`open_acp_client`."""

    def __init__(
        self,
        *,
        permission: PermissionPolicy = allow,
        elicitation: ElicitationPolicy | None = None,
        schema: AcpSchema | None = None,
    ) -> None:
        self.frames: list[Frame] = []
        self.permission_policy = permission
        self.elicitation_policy = elicitation
        self.permission_requests: list[Mapping[str, Any]] = []
        self.elicitation_requests: list[Mapping[str, Any]] = []
        #: Answers to other requests the agent sends, by method (``mcp/message`` for the tools
        #: a client offers): each takes the params and returns the result.
        self.request_handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {}
        #: The schema every arriving frame is checked against (``None``: not checked).
        self.schema = schema
        #: The first frame from the agent that broke the schema, if any.
        self.violation: SchemaViolation | None = None
        #: Request id -> method, of every request this client sent (what an answer is
        #: checked against).
        self._sent_methods: dict[Any, str] = {}
        self._changed = trio.Event()
        self._peer: JsonRpcPeer | None = None
        self._serial = 0

    # --- plumbing ---------------------------------------------------------------------------

    def _notify_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _arrived(self, frame: Frame) -> None:
        """Check one frame against the schema as it moves (only the first violation is kept:
        the rest often follow from it)."""
        schema = self.schema
        if schema is None:
            return
        if frame.direction == "out":
            for sent in frame.message if isinstance(frame.message, list) else [frame.message]:
                if isinstance(sent, dict) and "method" in sent and "id" in sent:
                    self._sent_methods[sent["id"]] = sent["method"]
            return
        if self.violation is not None:
            return
        try:
            if frame.message is None:
                raise SchemaViolation(f"agent sent a non-JSON-RPC line: {frame.raw[:200]!r}")
            validate_frames(schema, [("in", frame.message)], methods=self._sent_methods)
        except SchemaViolation as violation:
            self.violation = violation

    def check(self) -> None:
        """Raise the first schema violation seen so far (with a ``schema``)."""
        if self.violation is not None:
            raise self.violation

    @property
    def peer(self) -> JsonRpcPeer:
        assert self._peer is not None, "the client is not connected"
        return self._peer

    async def _on_request(self, method: str, params: Any) -> Any:
        if method == "session/request_permission":
            self.permission_requests.append(params)
            decision = self.permission_policy(params)
            if isinstance(decision, Awaitable):
                decision = await decision
            return _permission_answer(params, decision)
        if method == "elicitation/create" and self.elicitation_policy is not None:
            self.elicitation_requests.append(params)
            answer = self.elicitation_policy(params)
            if isinstance(answer, Awaitable):
                answer = await answer
            return answer
        handler = self.request_handlers.get(method)
        if handler is not None:
            return await handler(params)
        raise method_not_found(method)

    # --- requests ---------------------------------------------------------------------------

    async def call(self, method: str, params: Any = None) -> Any:
        """Send a request and return its result; an error answer raises ``ProtocolError``."""
        return await self.peer.request(method, params)

    async def send(self, method: str, params: Any = None) -> str:
        """Write a request and return its id without waiting for the answer (it is recorded
        in :attr:`frames` when it comes: :meth:`answer` finds it). For steps that must not
        wait: a prompt whose turn runs on, requests written back to back (:meth:`send_all`)."""
        (msg_id,) = await self.send_all([(method, params)])
        return msg_id

    async def send_all(self, requests: Sequence[tuple[str, Any]]) -> list[str]:
        """Write ``(method, params)`` requests in one write, so the agent reads them back to
        back (wire order); ``session/cancel`` goes as the notification it is. Returns the
        requests' ids in order."""
        ids: list[str] = []
        lines: list[bytes] = []
        for method, params in requests:
            message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
            if method != "session/cancel":
                self._serial += 1
                message["id"] = f"sent-{self._serial}"
                ids.append(message["id"])
            lines.append(orjson.dumps(message) + b"\n")
        await self.peer.notify_lines(lines)
        return ids

    def answer(self, msg_id: str) -> Any:
        """The answer (the whole message) to the request ``msg_id``, or ``None`` until it
        came."""
        for frame in self.frames:
            message = frame.message
            if (
                frame.direction == "in"
                and isinstance(message, dict)
                and "method" not in message
                and message.get("id") == msg_id
            ):
                return message
        return None

    async def notify(self, method: str, params: Any = None) -> None:
        await self.peer.notify(method, params)

    async def send_raw(self, line: bytes) -> None:
        """Send one line exactly as given (it may be malformed; it must not contain ``\\n``)."""
        await self.peer.notify_encoded(line if line.endswith(b"\n") else line + b"\n")

    async def initialize(self, *, elicitation_form: bool = False, **extra: Any) -> Any:
        capabilities: dict[str, Any] = {}
        if elicitation_form:
            capabilities["elicitation"] = {"form": {}}
        params = {"protocolVersion": 1, "clientCapabilities": capabilities, **extra}
        return await self.call("initialize", params)

    async def new_session(
        self, cwd: str, *, mcp_servers: list[Any] | None = None, **extra: Any
    ) -> Any:
        return await self.call(
            "session/new", {"cwd": cwd, "mcpServers": mcp_servers or [], **extra}
        )

    async def load_session(
        self, session_id: str, cwd: str, *, mcp_servers: list[Any] | None = None
    ) -> Any:
        return await self.call(
            "session/load", {"sessionId": session_id, "cwd": cwd, "mcpServers": mcp_servers or []}
        )

    async def resume_session(
        self, session_id: str, cwd: str, *, mcp_servers: list[Any] | None = None
    ) -> Any:
        return await self.call(
            "session/resume",
            {"sessionId": session_id, "cwd": cwd, "mcpServers": mcp_servers or []},
        )

    async def delete_session(self, session_id: str) -> Any:
        return await self.call("session/delete", {"sessionId": session_id})

    async def prompt(self, session_id: str, text: str | list[Any]) -> Any:
        blocks = [{"type": "text", "text": text}] if isinstance(text, str) else text
        return await self.call("session/prompt", {"sessionId": session_id, "prompt": blocks})

    async def cancel(self, session_id: str) -> None:
        await self.notify("session/cancel", {"sessionId": session_id})

    async def close_session(self, session_id: str) -> Any:
        return await self.call("session/close", {"sessionId": session_id})

    async def list_sessions(self, **params: Any) -> Any:
        return await self.call("session/list", params)

    # --- what arrived -----------------------------------------------------------------------

    def inbound(self) -> list[Any]:
        """Every parsed message the agent sent, in order (a batch's answer, one array line,
        as its members in order; ``batch_answers`` has the arrays)."""
        messages: list[Any] = []
        for frame in self.frames:
            if frame.direction == "in":
                if isinstance(frame.message, list):
                    messages.extend(frame.message)
                else:
                    messages.append(frame.message)
        return messages

    def batch_answers(self) -> list[list[Any]]:
        """Every array (a batch's answer) the agent sent, in order."""
        return [
            f.message for f in self.frames if f.direction == "in" and isinstance(f.message, list)
        ]

    def outbound(self) -> list[Any]:
        """Every parsed message this client sent, in order."""
        return [f.message for f in self.frames if f.direction == "out"]

    def updates(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The ``update`` objects of every ``session/update``, in arrival order."""
        out = []
        for message in self.inbound():
            if isinstance(message, dict) and message.get("method") == "session/update":
                params = message.get("params", {})
                if session_id is None or params.get("sessionId") == session_id:
                    out.append(params["update"])
        return out

    def text(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        """The concatenated text of one kind of chunk for a session."""
        return "".join(
            u["content"].get("text", "")
            for u in self.updates(session_id)
            if u.get("sessionUpdate") == kind
        )

    def messages(self, session_id: str) -> list[tuple[str, str, str]]:
        """The session's messages as a v2 client holds them after applying every update in
        order: ``(kind, message id, text)`` with ``kind`` ``user_message``, ``agent_message``
        or ``agent_thought``, in order of first appearance. A whole-message update replaces
        the message's content; a chunk appends to it."""
        held: dict[str, tuple[str, str]] = {}
        for update in self.updates(session_id):
            kind = update.get("sessionUpdate", "")
            whole = kind.removesuffix("_chunk")
            if whole not in ("user_message", "agent_message", "agent_thought"):
                continue
            message_id = update["messageId"]
            if kind == whole:
                blocks = update.get("content") or []
                text = "".join(b.get("text", "") for b in blocks)
            else:
                text = held.get(message_id, (whole, ""))[1] + update["content"].get("text", "")
            held[message_id] = (whole, text)
        return [(kind, message_id, text) for message_id, (kind, text) in held.items()]

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; re-checked whenever a frame arrives."""
        while not predicate():
            await self._changed.wait()

    def validate(self, schema: AcpSchema) -> int:
        """Check every frame the agent sent against the ACP schema; return how many.

        Responses are validated as the result type of the request they answer; error
        responses against ``Error`` plus the error contract (one line, ≤ 500 chars).
        """
        for frame in self.frames:
            if frame.direction == "in" and frame.message is None:
                raise SchemaViolation(f"agent sent a non-JSON-RPC line: {frame.raw[:200]!r}")
        return validate_frames(schema, ((f.direction, f.message) for f in self.frames))


@asynccontextmanager
async def open_acp_client(
    stream: trio.abc.Stream,
    *,
    permission: PermissionPolicy = allow,
    elicitation: ElicitationPolicy | None = None,
    schema: AcpSchema | None = None,
) -> AsyncIterator[AcpTestClient]:
    """Run an :class:`AcpTestClient` over ``stream`` for the duration of the block; with a
    ``schema``, every frame the agent sends is checked against it as it arrives, and the
    first violation is raised when the block ends normally.

    Resource handling: the client owns ``stream`` and closes it when the block exits (which
    the service sees as a disconnect).
    """
    client = AcpTestClient(permission=permission, elicitation=elicitation, schema=schema)
    recording = _RecordingStream(stream, client.frames, client._notify_changed, client._arrived)
    peer = JsonRpcPeer(recording, on_request=client._on_request)
    # A batch's answer is an array: its members are answers like any other.
    peer.accept_batches = True
    client._peer = peer
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.serve)
        try:
            yield client
        finally:
            await peer.aclose()
    client.check()
