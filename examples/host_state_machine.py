"""A host's own property test: its engine behind the ACP edge, and a Hypothesis state machine
over what clients may do to it. Copy it, put your engine in place of ``EchoEngine``, add rules.

Each example starts a fresh service (``running_acp``: your engine, a real SQLite store) in the
Trio loop ``TrioDriver`` runs beside Hypothesis's synchronous rules; a step returns once the
service is quiet. ``AcpLedger`` checks the library's promises over every frame after each step
(each frame is also checked against the ACP schema as it arrives). Run it with pytest.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from maple_acp.runtime import AskForTools, ModelInfo, StaticModelCatalog, ToolRequest, Turn
from maple_acp.testing.client import HeldPermissions
from maple_acp.testing.driver import TrioDriver
from maple_acp.testing.invariants import AcpLedger
from maple_acp.testing.schema import load_acp_schema
from maple_acp.testing.service import HarnessConnection, running_acp

TOOL = "echo_tool"  # the engine's one tool: the policy asks the client before it runs
QUEUE = "_session/queue"  # a prompt sent while a turn runs waits in the session's queue
SCHEMA = load_acp_schema()
picks = st.integers(0, 7)  # which connection or session a rule acts on (modulo how many)


class EchoEngine:
    """The engine under test: "wait" runs until cancelled, "ask" asks first, the rest echoes."""

    async def run_turn(self, turn: Turn) -> None:
        if turn.prompt == "wait":
            await trio.sleep_forever()
        if turn.prompt == "ask":
            asked = ToolRequest(tool_id=f"{turn.run_id}-tool", name=TOOL, title="echo")
            await turn.send_text("allowed" if await turn.ask_permission(asked) else "denied")
            return
        await turn.send_text(turn.prompt)


class HostMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.project = Path(self.directory.name, "project")
        self.project.mkdir()
        self.where = {"cwd": str(self.project), "mcpServers": []}
        self.driver = TrioDriver()
        self.harness = self.driver.enter(
            running_acp(
                self.directory.name,
                backend=EchoEngine(),
                catalog=StaticModelCatalog((ModelInfo(id="echo", name="Echo"),)),
                policy=AskForTools(frozenset({TOOL})),
            )
        )
        self.ledger = AcpLedger(self.harness.runtime)
        self.conns: list[tuple[HarnessConnection, HeldPermissions]] = []
        self.sessions: list[str] = []
        #: Requests written back to back: (connection, their ids).
        self.pairs: list[tuple[HarnessConnection, list[str]]] = []

    def live(self) -> list[tuple[HarnessConnection, HeldPermissions]]:
        return [(conn, held) for conn, held in self.conns if conn.alive]

    def send(self, at: int, method: str, session: int, **params: Any) -> None:
        conn = self.live()[at % len(self.live())][0]
        sid = self.sessions[session % len(self.sessions)]
        self.driver.run(conn.client.send, method, {"sessionId": sid, **params})

    @rule()
    def connect(self) -> None:
        held = HeldPermissions()
        conn = self.driver.run(
            self.harness.open_connection, initialize=True, permission=held, schema=SCHEMA
        )
        self.conns.append((self.ledger.watch(conn), held))

    @precondition(lambda self: self.live())
    @rule(at=picks)
    def new_session(self, at: int) -> None:
        client = self.live()[at % len(self.live())][0].client
        self.sessions.append(self.driver.run(client.new_session, str(self.project))["sessionId"])

    @precondition(lambda self: self.live() and self.sessions)
    @rule(at=picks, session=picks, text=st.sampled_from(["hello", "wait", "ask"]))
    def prompt(self, at: int, session: int, text: str) -> None:
        self.send(at, "session/prompt", session, prompt=[{"type": "text", "text": text}])

    @precondition(lambda self: self.live() and self.sessions)
    @rule(at=picks, session=picks, method=st.sampled_from(["session/load", "session/close", QUEUE]))
    def load_close_or_clear(self, at: int, session: int, method: str) -> None:
        params = {"action": "clear"} if method == QUEUE else self.where  # withdraw waiting prompts
        self.send(at, method, session, **params)

    @precondition(lambda self: self.live() and self.sessions)
    @rule(at=picks, session=picks, close=st.booleans())
    def back_to_back(self, at: int, session: int, close: bool) -> None:
        # A close then a load, or a cancel then a prompt, of one session in one write.
        conn = self.live()[at % len(self.live())][0]
        sid = {"sessionId": self.sessions[session % len(self.sessions)]}
        load = (("session/close", sid), ("session/load", {**sid, **self.where}))
        text = {**sid, "prompt": [{"type": "text", "text": "hello"}]}
        pair = load if close else (("session/cancel", sid), ("session/prompt", text))
        self.pairs.append((conn, self.driver.run(conn.client.send_all, pair)))

    @precondition(lambda self: any(held.pending for _, held in self.live()))
    @rule(decision=st.sampled_from(["allow", "reject", "cancel"]))
    def answer_permission(self, decision: str) -> None:
        held = next(held for _, held in self.live() if held.pending)
        self.driver.call(held.answer_next, decision)

    @precondition(lambda self: self.live())
    @rule(at=picks)
    def disconnect(self, at: int) -> None:
        self.driver.run(self.ledger.disconnect, self.live()[at % len(self.live())][0])

    @rule(seconds=st.sampled_from([1.0, 5.0, 60.0]))
    def advance(self, seconds: float) -> None:
        self.driver.advance(seconds)

    @invariant()
    def promises_hold(self) -> None:
        self.ledger.check()
        for conn, ids in self.pairs:
            # A load written right after a close that ended the session, or a prompt right
            # after a cancel, is never refused for the state the first one ended (-32600).
            first, second = (conn.client.answer(msg_id) or {} for msg_id in (ids[0], ids[-1]))
            if len(ids) == 1 or "result" in first:
                assert second.get("error", {}).get("code") != -32600, second

    def teardown(self) -> None:
        try:
            for conn, _ in self.live():
                for sid in self.sessions:
                    self.driver.run(conn.client.cancel, sid)
            self.ledger.check(complete=True)
        finally:
            self.driver.close()
            self.directory.cleanup()


HostMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=20, deadline=None)
test_host_machine = HostMachine.TestCase
