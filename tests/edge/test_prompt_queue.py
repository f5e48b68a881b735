"""The prompt queue over the wire, on v1 and v2: a prompt sent while a turn runs waits its turn
(first in, first out, at most 8 waiting) instead of being refused; each is answered as its
own turn ends (v1) or starts (v2); a cancel withdraws every waiting prompt with the running
turn; ``_session/queue`` lists, removes and clears; ``_session/queue_changed`` follows every
change; a waiting prompt's message is not in the history until its turn starts. Every frame
is checked against the schema of the negotiated version (the queue notification against its
documented shape)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import Harness, running_service
from test_acp_v2 import initialize_v2, states, wait_idle

from maple_acp.edge import AcpServiceConfig
from maple_acp.model import ItemKind
from maple_acp.runtime import MAX_QUEUED_PROMPTS
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

QUEUE = "_session/queue"
QUEUE_CHANGED = "_session/queue_changed"
STEER = "_session/steering"
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
REQUEST_CANCELLED = -32800


@pytest.fixture
async def v2_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    home = tmp_path / "v2"
    home.mkdir()
    async with running_service(home, config=AcpServiceConfig(protocol_max=2)) as running:
        yield running


def prompt(sid: str, text: str) -> tuple[str, dict[str, Any]]:
    return "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}


def cancel(sid: str) -> tuple[str, dict[str, Any]]:
    return "session/cancel", {"sessionId": sid}


def answer_index(client: AcpTestClient, msg_id: str) -> int:
    """Where the answer to ``msg_id`` is among the frames the client received."""
    for index, frame in enumerate(client.frames):
        message = frame.message
        if (
            frame.direction == "in"
            and isinstance(message, dict)
            and message.get("id") == msg_id
            and "method" not in message
        ):
            return index
    raise AssertionError(f"no answer to {msg_id}")


def update_index(client: AcpTestClient, sid: str, text: str) -> int:
    """Where the agent text chunk ``text`` of ``sid`` is among the frames received."""
    for index, frame in enumerate(client.frames):
        m = frame.message
        if (
            frame.direction == "in"
            and isinstance(m, dict)
            and m.get("method") == "session/update"
            and m["params"]["sessionId"] == sid
            and m["params"]["update"].get("content", {}).get("text") == text
        ):
            return index
    raise AssertionError(f"no update saying {text!r}")


async def answers(client: AcpTestClient, ids: list[str]) -> list[dict[str, Any]]:
    with trio.fail_after(10):
        await client.wait_until(lambda: all(client.answer(i) is not None for i in ids))
    return [client.answer(i) for i in ids]


def queue_changes(client: AcpTestClient, sid: str) -> list[list[str]]:
    """The previews of each ``_session/queue_changed`` of ``sid``, in order."""
    return [
        [entry["preview"] for entry in m["params"]["entries"]]
        for m in client.inbound()
        if isinstance(m, dict)
        and m.get("method") == QUEUE_CHANGED
        and m["params"]["sessionId"] == sid
    ]


async def wait_queued(client: AcpTestClient, sid: str, count: int) -> None:
    """Until the latest queue notification lists ``count`` waiting prompts, and a listing
    agrees."""
    with trio.fail_after(10):
        await client.wait_until(lambda: len((queue_changes(client, sid) or [[]])[-1]) == count)
    listed = await client.call(QUEUE, {"sessionId": sid, "action": "list"})
    assert len(listed["entries"]) == count


async def wait_running(harness: Harness, runs: int = 1) -> None:
    """Until the host runs ``runs`` turns (the running prompt's message is stored by then)."""
    with trio.fail_after(10):
        # The runtime has no event for a run's start seen from outside: its count is polled.
        while harness.runtime.status().active_runs != runs:  # noqa: ASYNC110
            await trio.sleep(0.01)


async def user_texts(harness: Harness, sid: str) -> list[str]:
    """The user messages the store holds for the session, in order."""
    history = await harness.runtime.task_history(sid)
    return [item.text for item in history if item.kind is ItemKind.USER]


# --- v1 ---------------------------------------------------------------------------------------


async def test_v1_advertises_the_queue_and_v2_carries_it(
    harness: Harness, v2_harness: Harness
) -> None:
    async with harness.connect() as client:
        answer = await client.initialize()
        assert answer["agentCapabilities"]["_meta"]["maple.promptQueue"] == {"max": 8}
        # The other extensions stay where they were.
        assert answer["_meta"]["steering"] == {"supported": True}
    async with v2_harness.connect() as client:
        answer = await initialize_v2(client)
        assert answer["capabilities"]["_meta"]["maple.promptQueue"] == {"max": 8}
        assert answer["_meta"]["steering"] == {"supported": True}
    assert MAX_QUEUED_PROMPTS == 8


async def test_prompts_sent_while_a_turn_runs_wait_then_run_in_order(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True, schema=acp_schema) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        running, first, second = await client.send_all(
            [prompt(sid, "/listen"), prompt(sid, "/echo one"), prompt(sid, "/echo two")]
        )
        await wait_queued(client, sid, 2)
        await wait_running(harness)
        listed = await client.call(QUEUE, {"sessionId": sid, "action": "list"})
        assert [e["preview"] for e in listed["entries"]] == ["/echo one", "/echo two"]
        for entry in listed["entries"]:
            assert entry["entryId"]
            assert datetime.fromisoformat(entry["queuedAt"]).tzinfo is not None
        # Neither waiting message is in the history yet: only the running turn's.
        assert await user_texts(harness, sid) == ["/listen"]
        assert client.answer(first) is None
        assert client.answer(second) is None
        # Steering joins the running turn, never a waiting prompt.
        steered = await client.call(
            STEER, {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}
        )
        assert steered == {"outcome": "injected"}
        got = await answers(client, [running, first, second])
        assert [a["result"]["stopReason"] for a in got] == ["end_turn"] * 3
        # Answered in order, each turn's text after the answer before it.
        order = [answer_index(client, i) for i in (running, first, second)]
        assert order == sorted(order)
        said = [update_index(client, sid, text) for text in ("one", "two")]
        assert order[0] < said[0] < order[1] < said[1] < order[2]
        assert client.text(sid) == "steered: goonetwo"
        assert await user_texts(harness, sid) == ["/listen", "go", "/echo one", "/echo two"]
        with trio.fail_after(10):
            await client.wait_until(lambda: queue_changes(client, sid)[-1:] == [[]])
        # The first change listed the first waiting prompt; the last one is empty.
        assert queue_changes(client, sid)[0][0] == "/echo one"


async def test_the_ninth_waiting_prompt_is_refused_naming_the_limit(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True, schema=acp_schema) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        ids = await client.send_all(
            [prompt(sid, "/hang"), *(prompt(sid, f"/echo {n}") for n in range(9))]
        )
        (refused,) = await answers(client, ids[-1:])
        assert refused["error"]["code"] == INVALID_REQUEST
        assert "8" in refused["error"]["message"]
        await wait_queued(client, sid, 8)
        await wait_running(harness)
        # A cancel ends the running turn and withdraws every waiting prompt, in queue order.
        await client.cancel(sid)
        got = await answers(client, ids[:-1])
        assert [a["result"]["stopReason"] for a in got] == ["cancelled"] * 9
        withdrawn = [answer_index(client, i) for i in ids[1:-1]]
        assert withdrawn == sorted(withdrawn)
        assert await user_texts(harness, sid) == ["/hang"]
        # The session takes the next prompt at once.
        assert (await client.prompt(sid, "/echo after"))["stopReason"] == "end_turn"


async def test_a_prompt_written_right_after_a_cancel_waits_for_the_cancelled_turn(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True, schema=acp_schema) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        for round_ in range(20):
            hung, queued = await client.send_all([prompt(sid, "/hang"), prompt(sid, "/echo x")])
            # The cancel withdraws the waiting prompt; the one right after it runs.
            (after,) = await client.send_all([cancel(sid), prompt(sid, f"/echo r{round_}")])
            got = await answers(client, [hung, queued, after])
            assert [a["result"]["stopReason"] for a in got] == [
                "cancelled",
                "cancelled",
                "end_turn",
            ]
            assert answer_index(client, hung) < answer_index(client, after)
        assert client.text(sid) == "".join(f"r{n}" for n in range(20))


async def test_remove_and_clear_withdraw_waiting_prompts(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True, schema=acp_schema) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        hung, one, two, three = await client.send_all(
            [prompt(sid, "/hang"), *(prompt(sid, f"/echo {n}") for n in ("one", "two", "three"))]
        )
        await wait_queued(client, sid, 3)
        await wait_running(harness)
        entries = (await client.call(QUEUE, {"sessionId": sid, "action": "list"}))["entries"]
        removed = entries[1]["entryId"]
        assert (
            await client.call(QUEUE, {"sessionId": sid, "action": "remove", "entryId": removed})
            == {}
        )
        (answer,) = await answers(client, [two])
        assert answer["result"] == {"stopReason": "cancelled"}
        listed = await client.call(QUEUE, {"sessionId": sid, "action": "list"})
        assert [e["preview"] for e in listed["entries"]] == ["/echo one", "/echo three"]
        # Removing it again names the field.
        with pytest.raises(ProtocolError) as gone:
            await client.call(QUEUE, {"sessionId": sid, "action": "remove", "entryId": removed})
        assert gone.value.code == INVALID_PARAMS
        assert "entryId" in gone.value.message
        assert await client.call(QUEUE, {"sessionId": sid, "action": "clear"}) == {}
        got = await answers(client, [one, three])
        assert [a["result"]["stopReason"] for a in got] == ["cancelled"] * 2
        assert answer_index(client, one) < answer_index(client, three)
        with trio.fail_after(10):
            await client.wait_until(lambda: queue_changes(client, sid)[-1:] == [[]])
        # The running turn goes on until its own cancel.
        assert client.answer(hung) is None
        await client.cancel(sid)
        (ended,) = await answers(client, [hung])
        assert ended["result"]["stopReason"] == "cancelled"
        assert await user_texts(harness, sid) == ["/hang"]


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"action": "drop"}, "action"),
        ({"action": "remove"}, "entryId"),
        ({"action": "remove", "entryId": "q-none"}, "entryId"),
        ({"action": "remove", "entryId": 7}, "entryId"),
        ({"action": "list", "entryId": None, "sessionId": 3}, "sessionId"),
        ([1, 2], "params"),
    ],
)
async def test_bad_queue_requests_are_invalid_params_in_one_line(
    harness: Harness, project: Path, acp_schema: AcpSchema, params: Any, names: str
) -> None:
    async with harness.connect(initialize=True, schema=acp_schema) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        if isinstance(params, dict):
            params = {"sessionId": sid, **params}
        with pytest.raises(ProtocolError) as refused:
            await client.call(QUEUE, params)
        assert refused.value.code == INVALID_PARAMS
        assert "\n" not in refused.value.message
        # The connection and the session go on.
        assert (await client.prompt(sid, "/echo fine"))["stopReason"] == "end_turn"


async def test_close_answers_every_waiting_prompt_cancelled(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True, schema=acp_schema) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        ids = await client.send_all([prompt(sid, "/hang"), prompt(sid, "a"), prompt(sid, "b")])
        await wait_queued(client, sid, 2)
        await wait_running(harness)
        assert await client.close_session(sid) == {}
        got = await answers(client, ids)
        assert [a["result"]["stopReason"] for a in got] == ["cancelled"] * 3
        assert answer_index(client, ids[1]) < answer_index(client, ids[2])
    assert await user_texts(harness, sid) == ["/hang"]


async def test_a_disconnect_admits_nothing_that_waited(harness: Harness, project: Path) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.send_all([prompt(sid, "/hang"), prompt(sid, "a"), prompt(sid, "b")])
        await wait_queued(client, sid, 2)
        await wait_running(harness)
    with trio.fail_after(10):
        # The runtime has no event for a lease's end: its count is polled.
        while harness.runtime.status().leases:  # noqa: ASYNC110
            await trio.sleep(0.01)
    assert await user_texts(harness, sid) == ["/hang"]
    # Loaded again, the session runs a prompt of its own: nothing left over starts.
    async with harness.connect(initialize=True) as client:
        await client.load_session(sid, str(project))
        assert (await client.prompt(sid, "/echo again"))["stopReason"] == "end_turn"
        assert client.text(sid) == "again"
    assert await user_texts(harness, sid) == ["/hang", "/echo again"]


async def test_a_revocation_answers_every_waiting_prompt_cancelled(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True, schema=acp_schema) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        ids = await client.send_all([prompt(sid, "/hang"), prompt(sid, "a"), prompt(sid, "b")])
        await wait_queued(client, sid, 2)
        await wait_running(harness)
        # Signing out revokes every lease: the turn ends, what waits is withdrawn.
        harness.runtime.sign_out()
        got = await answers(client, ids)
        assert [a["result"]["stopReason"] for a in got] == ["cancelled"] * 3
        assert answer_index(client, ids[1]) < answer_index(client, ids[2])


# --- v2 ---------------------------------------------------------------------------------------


async def test_on_v2_a_waiting_prompt_is_answered_when_its_turn_starts(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_harness.connect(schema=acp_schema_v2) as client:
        await initialize_v2(client)
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        running, waiting = await client.send_all(
            [prompt(sid, "/listen"), prompt(sid, "/echo next")]
        )
        (accepted,) = await answers(client, [running])
        assert accepted["result"]["messageId"]
        await wait_queued(client, sid, 1)
        await wait_running(v2_harness)
        # Not answered, not echoed, not stored while it waits.
        assert client.answer(waiting) is None
        assert [m[2] for m in client.messages(sid) if m[0] == "user_message"] == ["/listen"]
        assert await user_texts(v2_harness, sid) == ["/listen"]
        await client.call(STEER, {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
        (started,) = await answers(client, [waiting])
        message_id = started["result"]["messageId"]
        await wait_idle(client, sid, 2)
        assert states(client, sid) == ["running", "idle:end_turn", "running", "idle:end_turn"]
        users = [m for m in client.messages(sid) if m[0] == "user_message"]
        assert (users[-1][1], users[-1][2]) == (message_id, "/echo next")
        with trio.fail_after(10):
            await client.wait_until(lambda: queue_changes(client, sid)[-1:] == [[]])


async def test_on_v2_a_cancel_refuses_every_waiting_prompt_in_order(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_harness.connect(schema=acp_schema_v2) as client:
        await initialize_v2(client)
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        ids = await client.send_all(
            [
                prompt(sid, "/hang"),
                *(prompt(sid, f"/echo {n}") for n in range(MAX_QUEUED_PROMPTS + 1)),
            ]
        )
        refused = (await answers(client, ids[-1:]))[0]
        assert refused["error"]["code"] == INVALID_REQUEST
        assert "8" in refused["error"]["message"]
        await wait_queued(client, sid, MAX_QUEUED_PROMPTS)
        await wait_running(v2_harness)
        entries = (await client.call(QUEUE, {"sessionId": sid, "action": "list"}))["entries"]
        await client.call(
            QUEUE, {"sessionId": sid, "action": "remove", "entryId": entries[0]["entryId"]}
        )
        (removed,) = await answers(client, [ids[1]])
        assert removed["error"]["code"] == REQUEST_CANCELLED
        await client.cancel(sid)
        got = await answers(client, ids[2:-1])
        assert [a["error"]["code"] for a in got] == [REQUEST_CANCELLED] * (MAX_QUEUED_PROMPTS - 1)
        order = [answer_index(client, i) for i in ids[2:-1]]
        assert order == sorted(order)
        await wait_idle(client, sid)
        assert states(client, sid) == ["running", "idle:cancelled"]
        assert await user_texts(v2_harness, sid) == ["/hang"]


async def test_on_v2_a_retry_of_a_waiting_prompt_gets_its_answer_when_it_starts(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_harness.connect(schema=acp_schema_v2) as client:
        await initialize_v2(client)
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        keyed = {
            "sessionId": sid,
            "prompt": [{"type": "text", "text": "/echo keyed"}],
            "idempotencyKey": "k-1",
        }
        _, original, retry = await client.send_all(
            [prompt(sid, "/listen"), ("session/prompt", keyed), ("session/prompt", keyed)]
        )
        await wait_queued(client, sid, 1)
        # The retry decided (it waits for its original): a cancel behind it is not held up,
        # and a request after it is answered at once.
        listed = await client.call(QUEUE, {"sessionId": sid, "action": "list"})
        assert [e["preview"] for e in listed["entries"]] == ["/echo keyed"]
        assert client.answer(original) is None
        assert client.answer(retry) is None
        await client.call(STEER, {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
        first, again = await answers(client, [original, retry])
        assert first["result"] == again["result"]
        await wait_idle(client, sid, 2)
        assert await user_texts(v2_harness, sid) == ["/listen", "go", "/echo keyed"]
