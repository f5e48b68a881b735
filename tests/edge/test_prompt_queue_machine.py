"""The prompt queue under any sequence of what clients may do, over the wire, on v1 and v2: a
Hypothesis state machine whose steps queue prompts behind a running turn, list, remove and
clear the queue, cancel (alone, or with a prompt written right after it), close and
disconnect, and whose invariants are the queue's promises:

- every prompt request is answered at most once at every step, and exactly once in the end
  (once every session is cancelled), unless its connection ended first;
- a prompt withdrawn while it waited (removed, cleared, cancelled, closed) is answered at once,
  as cancelled in its version's way (v1 ``{stopReason: "cancelled"}``, v2 ``-32800``);
- on v2, where ``-32800`` means withdrawn and nothing else, a prompt that was never withdrawn
  is never answered so;
- ``_session/queue`` ``list`` shows the waiting prompts in the order they were sent, and a
  ``remove`` of an id no prompt has is ``-32602``;
- the library's own promises (``AcpLedger``) hold, and every frame meets the schema of its
  connection's version.

Each prompt's text is unique, so a listed entry's preview names the request that sent it.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from maple_acp.edge import AcpServiceConfig
from maple_acp.runtime import AskForTools, ModelInfo, StaticModelCatalog, Turn
from maple_acp.testing.client import Frame
from maple_acp.testing.driver import TrioDriver
from maple_acp.testing.invariants import AcpLedger
from maple_acp.testing.schema import load_acp_schema
from maple_acp.testing.service import HarnessConnection, running_acp

QUEUE = "_session/queue"
INVALID_PARAMS = -32602
REQUEST_CANCELLED = -32800
V2_INFO = {"name": "queue-machine", "version": "0"}
SCHEMAS = {1: load_acp_schema(1), 2: load_acp_schema(2)}
#: Which connection or session a step acts on (modulo how many there are).
picks = st.integers(0, 7)


class QueueEngine:
    """A prompt whose text starts with "wait" runs until cancelled; any other is echoed."""

    async def run_turn(self, turn: Turn) -> None:
        if turn.prompt.startswith("wait"):
            await trio.sleep_forever()
        await turn.send_text(turn.prompt)


class SessionModel:
    def __init__(self, conn: HarnessConnection, sid: str, version: int) -> None:
        self.conn = conn
        self.sid = sid
        self.version = version


class PromptModel:
    def __init__(self, session: SessionModel, msg_id: str, text: str) -> None:
        self.session = session
        self.msg_id = msg_id
        self.text = text


def answers_to(frames: list[Frame], msg_id: str) -> list[dict[str, Any]]:
    """Every answer the client received to ``msg_id`` (a batch's answers included)."""
    found: list[dict[str, Any]] = []
    for frame in frames:
        if frame.direction != "in":
            continue
        message = frame.message
        for item in message if isinstance(message, list) else [message]:
            if isinstance(item, dict) and "method" not in item and item.get("id") == msg_id:
                found.append(item)
    return found


def is_withdrawn_answer(answer: dict[str, Any], version: int) -> bool:
    """The answer a prompt withdrawn before its turn started gets, in ``version``'s way."""
    if version == 1:
        return bool(answer.get("result", {}).get("stopReason") == "cancelled")
    return bool(answer.get("error", {}).get("code") == REQUEST_CANCELLED)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.project = Path(self.directory.name, "project")
        self.project.mkdir()
        self.driver = TrioDriver()
        self.harness = self.driver.enter(
            running_acp(
                self.directory.name,
                backend=QueueEngine(),
                catalog=StaticModelCatalog((ModelInfo(id="echo", name="Echo"),)),
                policy=AskForTools(frozenset()),
                config=AcpServiceConfig(protocol_max=2),
            )
        )
        self.ledger = AcpLedger(self.harness.runtime)
        self.versions: dict[int, int] = {}
        self.conns: list[HarnessConnection] = []
        self.sessions: list[SessionModel] = []
        #: Every prompt sent, by its text (request ids repeat across connections).
        self.prompts: dict[str, PromptModel] = {}
        #: The texts of prompts withdrawn while they waited: each must have its withdrawn answer.
        self.withdrawn: set[str] = set()
        self.serial = itertools.count(1)

    def live_sessions(self) -> list[SessionModel]:
        return [session for session in self.sessions if session.conn.alive]

    def pick(self, at: int) -> SessionModel:
        live = self.live_sessions()
        return live[at % len(live)]

    def entries(self, session: SessionModel) -> list[dict[str, Any]]:
        """The session's waiting prompts as ``_session/queue`` lists them, first to run first."""
        listing = self.driver.run(
            session.conn.client.call, QUEUE, {"sessionId": session.sid, "action": "list"}
        )
        return list(listing["entries"])

    def listed(self, session: SessionModel) -> list[PromptModel]:
        return [self.prompts[entry["preview"]] for entry in self.entries(session)]

    # -- steps -------------------------------------------------------------------------------

    @rule(version=st.sampled_from([1, 2]))
    def connect(self, version: int) -> None:
        conn = self.driver.run(self.harness.open_connection, schema=SCHEMAS[version])
        params: dict[str, Any] = (
            {"protocolVersion": 1, "clientCapabilities": {}}
            if version == 1
            else {"protocolVersion": 2, "info": V2_INFO, "capabilities": {}}
        )
        answer = self.driver.run(conn.client.call, "initialize", params)
        assert answer["protocolVersion"] == version
        self.versions[id(conn)] = version
        self.conns.append(self.ledger.watch(conn))

    @precondition(lambda self: any(conn.alive for conn in self.conns))
    @rule(at=picks)
    def new_session(self, at: int) -> None:
        live = [conn for conn in self.conns if conn.alive]
        conn = live[at % len(live)]
        version = self.versions[id(conn)]
        params: dict[str, Any] = {"cwd": str(self.project)}
        if version == 1:
            params["mcpServers"] = []
        sid = self.driver.run(conn.client.call, "session/new", params)["sessionId"]
        self.sessions.append(SessionModel(conn, sid, version))

    @precondition(lambda self: self.live_sessions())
    @rule(at=picks, waits=st.booleans())
    def prompt(self, at: int, waits: bool) -> None:
        session = self.pick(at)
        text = f"{'wait' if waits else 'echo'}-{next(self.serial)}"
        msg_id = self.driver.run(
            session.conn.client.send,
            "session/prompt",
            {"sessionId": session.sid, "prompt": [{"type": "text", "text": text}]},
        )
        self.prompts[text] = PromptModel(session, msg_id, text)

    @precondition(lambda self: self.live_sessions())
    @rule(at=picks, which=picks)
    def remove(self, at: int, which: int) -> None:
        session = self.pick(at)
        waiting = self.entries(session)
        params = {"sessionId": session.sid, "action": "remove"}
        if not waiting:
            msg_id = self.driver.run(
                session.conn.client.send, QUEUE, {**params, "entryId": "q0-absent"}
            )
            refused = session.conn.client.answer(msg_id)
            assert refused["error"]["code"] == INVALID_PARAMS, refused
            return
        entry = waiting[which % len(waiting)]
        target = self.prompts[entry["preview"]]
        removed = self.driver.run(
            session.conn.client.call, QUEUE, {**params, "entryId": entry["entryId"]}
        )
        assert removed == {}, removed
        self.withdrawn.add(target.text)
        assert target not in self.listed(session)

    @precondition(lambda self: self.live_sessions())
    @rule(at=picks, how=st.sampled_from(["clear", "cancel", "close"]))
    def withdraw_all(self, at: int, how: str) -> None:
        session = self.pick(at)
        waiting = self.listed(session)
        client, sid = session.conn.client, {"sessionId": session.sid}
        if how == "clear":
            assert self.driver.run(client.call, QUEUE, {**sid, "action": "clear"}) == {}
        elif how == "cancel":
            self.driver.run(client.notify, "session/cancel", sid)
        else:
            self.driver.run(client.call, "session/close", sid)
            self.sessions.remove(session)
        self.withdrawn.update(prompt.text for prompt in waiting)
        if how != "close":
            assert self.listed(session) == []

    @precondition(lambda self: self.live_sessions())
    @rule(at=picks)
    def cancel_then_prompt(self, at: int) -> None:
        # Written in one go: the cancel reaches only what came before it, so the prompt after
        # it waits for the cancelled turn to end and then runs, never withdrawn nor refused.
        session = self.pick(at)
        waiting = self.listed(session)
        text = f"echo-{next(self.serial)}"
        sid = {"sessionId": session.sid}
        (msg_id,) = self.driver.run(
            session.conn.client.send_all,
            [
                ("session/cancel", sid),
                ("session/prompt", {**sid, "prompt": [{"type": "text", "text": text}]}),
            ],
        )
        self.prompts[text] = PromptModel(session, msg_id, text)
        self.withdrawn.update(prompt.text for prompt in waiting)
        answer = session.conn.client.answer(msg_id)
        assert answer is not None, f"{text} is not answered"
        assert "result" in answer, answer
        assert answer["result"].get("stopReason") != "cancelled", answer

    @precondition(lambda self: any(conn.alive for conn in self.conns))
    @rule(at=picks)
    def disconnect(self, at: int) -> None:
        live = [conn for conn in self.conns if conn.alive]
        self.driver.run(self.ledger.disconnect, live[at % len(live)])

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def promises_hold(self) -> None:
        self.ledger.check()
        for conn in self.conns:
            conn.client.check()

    @invariant()
    def every_prompt_is_answered_at_most_once_and_withdrawn_ones_at_once(self) -> None:
        for text, prompt in self.prompts.items():
            conn = prompt.session.conn
            got = answers_to(conn.client.frames, prompt.msg_id)
            assert len(got) <= 1, f"prompt {prompt.text} answered {len(got)} times: {got}"
            if text not in self.withdrawn:
                # v1 answers a cancelled running turn the same way; v2 answers a prompt at
                # its turn's start, so its -32800 means withdrawn and nothing else.
                if got and prompt.session.version == 2:
                    assert not is_withdrawn_answer(got[0], 2), (prompt.text, got[0])
                continue
            if not got:
                # A connection that ended may never hear it; a live one must have it now.
                assert not conn.alive, f"withdrawn prompt {prompt.text} is not answered"
                continue
            assert is_withdrawn_answer(got[0], prompt.session.version), (prompt.text, got[0])

    @invariant()
    def the_queue_lists_prompts_in_the_order_they_were_sent(self) -> None:
        for session in self.live_sessions():
            order = [int(prompt.msg_id.rsplit("-", 1)[1]) for prompt in self.listed(session)]
            assert order == sorted(order), order

    def teardown(self) -> None:
        try:
            for session in self.live_sessions():
                self.driver.run(
                    session.conn.client.notify, "session/cancel", {"sessionId": session.sid}
                )
            for prompt in self.prompts.values():
                conn = prompt.session.conn
                got = answers_to(conn.client.frames, prompt.msg_id)
                if conn.alive:
                    assert len(got) == 1, f"prompt {prompt.text} answered {len(got)} times"
            self.ledger.check(complete=True)
        finally:
            self.driver.close()
            self.directory.cleanup()


QueueMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)
test_prompt_queue_machine = QueueMachine.TestCase
