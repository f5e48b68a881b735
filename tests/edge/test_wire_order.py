"""Wire order is admission order: requests written together on one connection are decided in
the order they arrived, whatever order Trio runs their tasks in (it shuffles them on
purpose), while their work runs concurrently. Of two prompts written together the first runs
first; the second waits for it in the session's queue.

Each pair that used to race runs many trials over one service; then a Hypothesis property:
for any requests about two sessions written at once, every decision (a prompt accepted or
refused, a steer's outcome, a model change allowed or locked, a close) is the one a
one-at-a-time reading makes (a prompt written while a turn runs waits in the queue)."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio
from edge_harness import Harness, running_service
from hypothesis import given, settings
from hypothesis import strategies as st
from silent_listener import silent_listener

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient

#: Trials per pair: Trio reverses a batch of ready tasks at random, so a race between two
#: tasks started together loses about half the time; 200 trials leave it no place to hide.
TRIALS = 200
#: Scripts the property tries (each on a service of its own).
EXAMPLES = 30
STEER = "_session/steering"
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800
ANY_INJECTED = "injected"
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

_ids = itertools.count()


def request(method: str, params: dict[str, Any]) -> tuple[str, bytes]:
    msg_id = f"w{next(_ids)}"
    line = orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return msg_id, line + b"\n"


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


def answered(client: AcpTestClient, ids: set[str], since: int) -> dict[str, Any]:
    """The answers to ``ids`` among the frames from index ``since`` on (trials share a
    connection: reading only the new frames keeps each trial's cost flat)."""
    messages = (f.message for f in client.frames[since:] if f.direction == "in")
    return {
        m["id"]: m
        for m in messages
        if isinstance(m, dict) and "method" not in m and m.get("id") in ids
    }


def texts_since(client: AcpTestClient, sid: str, since: int) -> str:
    return "".join(
        f.message["params"]["update"]["content"]["text"]
        for f in client.frames[since:]
        if f.direction == "in"
        and isinstance(f.message, dict)
        and f.message.get("method") == "session/update"
        and f.message["params"]["sessionId"] == sid
        and f.message["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    )


async def write_together(client: AcpTestClient, lines: list[bytes]) -> None:
    """Every line in one write: the agent reads them all before any handler runs."""
    await client.peer.notify_lines(lines)


async def answers_of(client: AcpTestClient, ids: list[str], since: int = 0) -> list[Any]:
    wanted = set(ids)
    with trio.fail_after(10):
        await client.wait_until(lambda: len(answered(client, wanted, since)) == len(ids))
    got = answered(client, wanted, since)
    return [got[msg_id] for msg_id in ids]


def decision(answer: dict[str, Any]) -> Any:
    if "error" in answer:
        return answer["error"]["code"]
    return answer["result"]


async def test_a_prompt_then_a_steer_written_together_steers_that_prompt(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as client:
        # One session for every trial: each trial's turn has ended before the next begins.
        sid = (await client.new_session(str(project)))["sessionId"]
        for _ in range(TRIALS):
            since = len(client.frames)
            prompt_id, prompt = request(
                "session/prompt", {"sessionId": sid, "prompt": text("/listen")}
            )
            steer_id, steer = request(STEER, {"sessionId": sid, "prompt": text("and tests")})
            await write_together(client, [prompt, steer])
            prompted, steered = await answers_of(client, [prompt_id, steer_id], since)
            assert decision(steered) == {"outcome": "injected"}
            assert decision(prompted)["stopReason"] == "end_turn"
            assert "steered: and tests" in texts_since(client, sid, since)


async def test_two_prompts_written_together_run_the_first(harness: Harness, project: Path) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        for _ in range(TRIALS):
            since = len(client.frames)
            first_id, first = request("session/prompt", {"sessionId": sid, "prompt": text("one")})
            second_id, second = request("session/prompt", {"sessionId": sid, "prompt": text("two")})
            await write_together(client, [first, second])
            one, two = await answers_of(client, [first_id, second_id], since)
            # The second waits its turn in the queue: it runs after the first, never before.
            assert decision(one)["stopReason"] == "end_turn"
            assert decision(two)["stopReason"] == "end_turn"
            assert texts_since(client, sid, since) == "onetwo"


async def test_the_first_initialize_on_the_wire_chooses_the_version(tmp_path: Path) -> None:
    config = AcpServiceConfig(protocol_max=2)
    async with running_service(tmp_path, config=config) as harness:
        for _ in range(TRIALS):
            async with harness.connect() as client:
                v1_id, v1 = request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                v2_id, v2 = request(
                    "initialize",
                    {
                        "protocolVersion": 2,
                        "info": {"name": "t", "version": "0"},
                        "capabilities": {},
                    },
                )
                await write_together(client, [v1, v2])
                first, second = await answers_of(client, [v1_id, v2_id])
                # One connection speaks one version for its life: the first one's.
                assert decision(first)["protocolVersion"] == 1
                assert decision(second)["protocolVersion"] == 1
                # And the connection speaks v1: a v1-shaped session/new is answered.
                assert (await client.new_session(str(tmp_path)))["sessionId"]


async def test_a_cancel_reaches_a_prompt_waiting_for_its_turn_and_its_session(
    harness: Harness, project: Path
) -> None:
    # A load, a prompt and a cancel of one session written together: the prompt waits for
    # the load to open the session, and the cancel, which arrived last, still ends it (it
    # ran nothing), as a one-at-a-time reading would; nothing hangs.
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "kept")
        await client.close_session(sid)
        for _ in range(20):
            since = len(client.frames)
            load_id, load = request(
                "session/load", {"sessionId": sid, "cwd": str(project), "mcpServers": []}
            )
            prompt_id, prompt = request(
                "session/prompt", {"sessionId": sid, "prompt": text("/hang")}
            )
            cancel = orjson.dumps(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
            )
            await write_together(client, [load, prompt, cancel + b"\n"])
            loaded, prompted = await answers_of(client, [load_id, prompt_id], since)
            assert "error" not in loaded
            assert decision(prompted)["stopReason"] == "cancelled"
            await client.close_session(sid)


async def test_a_model_change_written_after_a_prompt_meets_the_lock(
    harness: Harness, project: Path
) -> None:
    # The prompt's message locks the model: a change written right after it is refused, even
    # though the message is stored after the change was read.
    async with harness.connect(initialize=True) as client:
        for _ in range(50):
            sid = (await client.new_session(str(project)))["sessionId"]
            since = len(client.frames)
            prompt_id, prompt = request("session/prompt", {"sessionId": sid, "prompt": text("hi")})
            change_id, change = request(
                "session/set_config_option",
                {"sessionId": sid, "configId": "model", "value": "demo-echo-large"},
            )
            await write_together(client, [prompt, change])
            prompted, changed = await answers_of(client, [prompt_id, change_id], since)
            assert decision(prompted)["stopReason"] == "end_turn"
            assert decision(changed) == INVALID_PARAMS


async def test_a_fork_or_a_delete_written_after_a_prompt_meets_its_turn(tmp_path: Path) -> None:
    # A prompt holds its session from its admission on: a fork or a delete written right
    # after it is refused (-32600) as while its run goes, though the run has not started yet.
    project = tmp_path / "project"
    project.mkdir()
    config = AcpServiceConfig(allow_session_delete=True)
    async with (
        running_service(tmp_path, config=config) as harness,
        harness.connect(initialize=True) as client,
    ):
        sid = (await client.new_session(str(project)))["sessionId"]
        for method in ("session/fork", "session/delete") * 25:
            since = len(client.frames)
            prompt_id, prompt = request("session/prompt", {"sessionId": sid, "prompt": text("hi")})
            params = {"sessionId": sid, "cwd": str(project)} if method == "session/fork" else {}
            other_id, other = request(method, {"sessionId": sid, **params})
            await write_together(client, [prompt, other])
            prompted, refused = await answers_of(client, [prompt_id, other_id], since)
            assert decision(prompted)["stopReason"] == "end_turn"
            assert decision(refused) == INVALID_REQUEST, method
        # Idle again: both go through.
        assert await client.call("session/fork", {"sessionId": sid, "cwd": str(project)})
        assert await client.delete_session(sid) == {}


async def test_bad_session_ids_are_refused_in_their_turn_and_the_connection_goes_on(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        for _ in range(20):
            since = len(client.frames)
            # A padded id is the same session (it is trimmed): ordered with the others.
            first_id, first = request(
                "session/prompt", {"sessionId": f"  {sid} ", "prompt": text("one")}
            )
            second_id, second = request("session/prompt", {"sessionId": sid, "prompt": text("two")})
            # Not a string, blank, unknown: refused on their own, decided nothing.
            odd = [
                request("session/prompt", {"sessionId": value, "prompt": text("x")})
                for value in (7, None, "   ", "no-such-session")
            ]
            await write_together(client, [first, second, *(line for _, line in odd)])
            ids = [first_id, second_id, *(msg_id for msg_id, _ in odd)]
            one, two, *refused = await answers_of(client, ids, since)
            assert decision(one)["stopReason"] == "end_turn"
            assert decision(two)["stopReason"] == "end_turn"
            assert texts_since(client, sid, since) == "onetwo"
            assert [decision(a) for a in refused] == [
                INVALID_PARAMS,
                INVALID_PARAMS,
                INVALID_PARAMS,
                RESOURCE_NOT_FOUND,
            ]
        assert (await client.prompt(sid, "after"))["stopReason"] == "end_turn"


# --- the property -----------------------------------------------------------------------------


@attrs.frozen
class Prompt:
    session: int


@attrs.frozen
class Steer:
    session: int
    prompt_required: bool


@attrs.frozen
class SetModel:
    session: int
    model: str


@attrs.frozen
class Close:
    session: int


@attrs.frozen
class Cancel:
    session: int


Op = Prompt | Steer | SetModel | Close | Cancel
MODELS = ("demo-echo", "demo-echo-large")
sessions = st.integers(0, 1)
ops: st.SearchStrategy[Op] = st.one_of(
    st.builds(Prompt, sessions),
    st.builds(Steer, sessions, st.booleans()),
    st.builds(SetModel, sessions, st.sampled_from(MODELS)),
    st.builds(Close, sessions),
    st.builds(Cancel, sessions),
)


@attrs.define
class Modelled:
    """One session as a one-at-a-time reading sees it."""

    model: str
    open: bool = True
    running: bool = False
    locked: bool = False
    #: After a cancel, how far the cancelled turn got is a matter of time, not of order: the
    #: session's later prompt, steer and model decisions are not predicted.
    unsettled: bool = False


def expected(op: Op, state: Modelled, ended_later: bool) -> Any:
    """The decisions a one-at-a-time reading allows (a set), and the op's effect on
    ``state``; ``None`` where the reading does not decide. ``ended_later``: a cancel or a
    close of the session comes later in the same write. A steer joins the turn of the prompt
    holding the slot, and a model change waits for that prompt's message; if that turn is
    cancelled or closed before it began, the steer is refused with it (``-32800`` /
    ``-32002``) and the model is not locked: how far the turn got is a matter of time."""
    allowed = _expected(op, state)
    if allowed is None or not ended_later or not state.running:
        return allowed
    if isinstance(op, Steer) and allowed == {ANY_INJECTED}:
        return allowed | {REQUEST_CANCELLED, RESOURCE_NOT_FOUND}
    if isinstance(op, SetModel):
        return allowed | {"model", INVALID_PARAMS}
    return allowed


def _expected(op: Op, state: Modelled) -> set[Any] | None:
    if isinstance(op, Cancel):
        if state.open:
            state.unsettled = True
        return None
    if not state.open:
        return {RESOURCE_NOT_FOUND}
    if isinstance(op, Close):
        state.open = False
        return {"closed"}
    if state.unsettled:
        return None
    if isinstance(op, Prompt):
        # While a turn runs the prompt waits in the queue (and is answered when its own turn
        # ends, or cancelled when the session's end withdraws it).
        state.running = state.locked = True
        return {"accepted"}
    if isinstance(op, Steer):
        if state.running:
            return {ANY_INJECTED}
        if op.prompt_required:
            return {"promptRequired"}
        state.running = state.locked = True
        return {"startedNewTurn"}
    if state.locked and op.model != state.model:
        return {INVALID_PARAMS}
    state.model = op.model
    return {"model"}


def observed(op: Op, answer: dict[str, Any]) -> Any:
    value = decision(answer)
    if isinstance(value, int):
        return value
    if isinstance(op, Prompt):
        return "accepted" if value["stopReason"] == "cancelled" else value
    if isinstance(op, Steer) and value.get("outcome") in ("promptRequired", "startedNewTurn"):
        return value["outcome"]
    if isinstance(op, Steer) and value == {"outcome": "injected"}:
        return ANY_INJECTED
    if isinstance(op, Close) and value == {}:
        return "closed"
    if isinstance(op, SetModel):
        model = next(o for o in value["configOptions"] if o["id"] == "model")
        return "model" if model["currentValue"] == op.model else value
    return value


def line_of(op: Op, sid: str) -> tuple[str | None, bytes]:
    if isinstance(op, Prompt):
        return request("session/prompt", {"sessionId": sid, "prompt": text("/hang")})
    if isinstance(op, Steer):
        params: dict[str, Any] = {"sessionId": sid, "prompt": text("/hang")}
        if op.prompt_required:
            params["_meta"] = {"steering": {"idleBehavior": "promptRequired"}}
        return request(STEER, params)
    if isinstance(op, SetModel):
        return request(
            "session/set_config_option",
            {"sessionId": sid, "configId": "model", "value": op.model},
        )
    if isinstance(op, Close):
        return request("session/close", {"sessionId": sid})
    notice = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
    return None, orjson.dumps(notice) + b"\n"


async def read_at_once(harness: Harness, directory: Path, script: list[Op]) -> None:
    async with harness.connect(initialize=True) as client:
        opened = [await client.new_session(str(directory)) for _ in range(2)]
        sids = [answer["sessionId"] for answer in opened]
        states = [
            Modelled(next(o for o in a["configOptions"] if o["id"] == "model")["currentValue"])
            for a in opened
        ]
        sent = [(op, *line_of(op, sids[op.session])) for op in script]
        await write_together(client, [line for _, _, line in sent])
        # Everything but the prompts answers while their turns hang; then both sessions are
        # closed (after everything above) and every hanging turn answers cancelled.
        settled = [msg_id for op, msg_id, _ in sent if msg_id and not isinstance(op, Prompt)]
        await answers_of(client, settled)
        ends = [request("session/close", {"sessionId": sid}) for sid in sids]
        await write_together(client, [line for _, line in ends])
        ids = [msg_id for _, msg_id, _ in sent if msg_id is not None]
        got = dict(zip(ids, await answers_of(client, ids), strict=True))
        await answers_of(client, [msg_id for msg_id, _ in ends])
        for index, (op, msg_id, _) in enumerate(sent):
            ended_later = any(
                isinstance(later, Cancel | Close) and later.session == op.session
                for later in script[index + 1 :]
            )
            allowed = expected(op, states[op.session], ended_later)
            if msg_id is not None and allowed is not None:
                assert observed(op, got[msg_id]) in allowed, (op, script)


@contextmanager
def project_directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        project = Path(directory) / "project"
        project.mkdir()
        yield project


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(ops, min_size=1, max_size=8))
def test_requests_written_at_once_are_decided_as_read_one_at_a_time(script: list[Op]) -> None:
    async def main(project: Path) -> None:
        with trio.fail_after(30):
            async with running_service(project.parent) as harness:
                await read_at_once(harness, project, script)

    with project_directory() as project:
        trio.run(main, project)


async def test_a_slow_load_holds_only_its_own_session_and_one_cancel(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as client, silent_listener() as (url, reached):
        slow = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(slow, "kept")
        await client.close_session(slow)
        other = (await client.new_session(str(project)))["sessionId"]
        (connection,) = harness.acp._connections  # the service's one connection: its peer
        server = {"type": "http", "name": "silent", "url": url, "headers": []}
        load_id, load = request(
            "session/load", {"sessionId": slow, "cwd": str(project), "mcpServers": [server]}
        )
        prompt_id, prompt = request("session/prompt", {"sessionId": slow, "prompt": text("x")})
        cancel = orjson.dumps(
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": slow}}
        )
        since = len(client.frames)
        await write_together(client, [load, prompt, *[cancel + b"\n"] * 1000])
        with trio.fail_after(10):
            await reached.wait()
        # Another session's requests do not wait for the load's setup.
        assert (await client.prompt(other, "meanwhile"))["stopReason"] == "end_turn"
        # 1000 cancels behind the load: one is held, standing for them all.
        assert connection.peer.held_actions == 1
        await client.notify("$/cancel_request", {"requestId": load_id})
        loaded, prompted = await answers_of(client, [load_id, prompt_id], since)
        assert decision(loaded) == REQUEST_CANCELLED
        assert decision(prompted) == RESOURCE_NOT_FOUND  # the load it waited for failed
        assert connection.peer.held_actions == 0
        assert (await client.load_session(slow, str(project)))["configOptions"]


async def test_on_v2_a_prompt_answered_on_acceptance_decides_as_early(tmp_path: Path) -> None:
    # A v2 prompt claims its slot in the turn it starts beside the request: still in order.
    project = tmp_path / "project"
    project.mkdir()
    v2 = {"protocolVersion": 2, "info": {"name": "t", "version": "0"}, "capabilities": {}}
    config = AcpServiceConfig(protocol_max=2)
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        await client.call("initialize", v2)
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        for _ in range(50):
            since = len(client.frames)
            lines = [
                request("session/prompt", {"sessionId": sid, "prompt": text("/listen")}),
                request(STEER, {"sessionId": sid, "prompt": text("and tests")}),
                request("session/prompt", {"sessionId": sid, "prompt": text("again")}),
            ]
            await write_together(client, [line for _, line in lines])
            accepted, steered, queued = await answers_of(client, [i for i, _ in lines], since)
            assert decision(accepted)["messageId"]
            assert decision(steered) == {"outcome": "injected"}
            # The second prompt waited for the first turn; the steer joined the first turn.
            assert decision(queued)["messageId"] != decision(accepted)["messageId"]
            # The steer reached the turn, and both turns ended before the next trial.
            with trio.fail_after(10):
                await client.wait_until(partial(said_since, client, since, b"steered: and tests"))
                await client.wait_until(partial(turns_ended_since, client, sid, since, 2))


def said_since(client: AcpTestClient, since: int, text: bytes) -> bool:
    return any(text in f.raw for f in client.frames[since:] if f.direction == "in")


def turns_ended_since(client: AcpTestClient, sid: str, since: int, count: int) -> bool:
    ended = 0
    for frame in client.frames[since:]:
        m = frame.message
        if frame.direction == "in" and isinstance(m, dict) and m.get("method") == "session/update":
            update = m["params"]["update"]
            if update.get("sessionUpdate") == "state_update" and update.get("state") == "idle":
                ended += 1
    return ended >= count
