"""An observing window prompts and steers like the holder: its prompt takes the session's slot
or waits in its queue (answered as its own turn ends on v1, as it starts on v2), the run it
starts is shown by the holder's connection and by every other window once each, its cancel
ends the running turn and withdraws every waiting prompt whoever sent it, and the queue's
changes reach it. Through the real wire on both versions, every frame checked against the
schema of the negotiated version."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import running_service
from test_observers import Windows, states, until
from test_prompt_queue import QUEUE, answer_index, queue_changes, wait_running

from maple_acp.edge import AcpServiceConfig
from maple_acp.edge._closing import CLOSE_DEADLINE_S
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema

STEER = "_session/steering"
REQUEST_CANCELLED = -32800


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
async def windows(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> AsyncIterator[Windows]:
    version: int = request.param
    async with running_service(tmp_path, config=AcpServiceConfig(protocol_max=2)) as harness:
        yield Windows(harness, version, acp_schema if version == 1 else acp_schema_v2)


def mentions(client: AcpTestClient, sid: str, kinds: tuple[str, ...], text: str) -> int:
    """How many updates of ``sid`` of a kind starting with one of ``kinds`` carry ``text``."""
    return sum(
        1
        for u in client.updates(sid)
        if u.get("sessionUpdate", "").startswith(kinds) and text in json.dumps(u)
    )


def user_shown(client: AcpTestClient, sid: str, text: str) -> int:
    return mentions(client, sid, ("user_message",), text)


def agent_shown(client: AcpTestClient, sid: str, text: str) -> int:
    return mentions(client, sid, ("agent_message",), text)


async def answered(client: AcpTestClient, msg_id: str) -> Any:
    await until(client, lambda: client.answer(msg_id) is not None)
    return client.answer(msg_id)


def update_position(client: AcpTestClient, sid: str, text: str) -> int:
    for index, frame in enumerate(client.frames):
        m = frame.message
        if (
            frame.direction == "in"
            and isinstance(m, dict)
            and m.get("method") == "session/update"
            and m["params"]["sessionId"] == sid
            and m["params"]["update"].get("sessionUpdate", "").startswith("agent_message")
            and text in json.dumps(m["params"]["update"])
        ):
            return index
    raise AssertionError(f"no update saying {text!r}")


async def test_an_observers_prompt_waits_for_the_holders_turn_and_every_window_sees_it_once(
    windows: Windows, project: Path
) -> None:
    async with (
        windows.window() as holder,
        windows.window() as phone,
        windows.window() as laptop,
    ):
        sid = await windows.new(holder, project)
        await windows.observe(phone, sid, project)
        await windows.observe(laptop, sid, project)
        running = await windows.prompt(holder, sid, "/listen")
        await wait_running(windows.harness)
        waiting = await windows.prompt(phone, sid, "/echo from the phone")
        # The queue's change reaches every window, the one that queued and the others.
        for client in (holder, phone, laptop):
            await until(
                client,
                lambda c=client: queue_changes(c, sid)[-1:] == [["/echo from the phone"]],  # type: ignore[misc]
            )
        # The holder's next prompt waits behind the phone's: one queue, first in first out.
        after = await windows.prompt(holder, sid, "/echo after")
        await until(holder, lambda: len((queue_changes(holder, sid) or [[]])[-1]) == 2)
        listed = await phone.call(QUEUE, {"sessionId": sid, "action": "list"})
        assert [e["preview"] for e in listed["entries"]] == ["/echo from the phone", "/echo after"]
        assert phone.answer(waiting) is None
        await holder.call(STEER, {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
        answer = await answered(phone, waiting)
        if windows.version == 1:
            assert answer["result"]["stopReason"] == "end_turn"
            assert (await answered(holder, running))["result"]["stopReason"] == "end_turn"
            # Answered after its turn's text, which came after the holder's turn.
            assert update_position(phone, sid, "steered: go") < update_position(
                phone, sid, "from the phone"
            )
            assert update_position(phone, sid, "from the phone") < answer_index(phone, waiting)
        else:
            message_id = answer["result"]["messageId"]
            users = [m for m in phone.messages(sid) if m[0] == "user_message"]
            await until(phone, lambda: states(phone, sid)[-1:] == ["idle:end_turn"])
            users = [m for m in phone.messages(sid) if m[0] == "user_message"]
            assert (users[-1][1], users[-1][2]) == (message_id, "/echo from the phone")
            for client in (holder, phone, laptop):
                await until(
                    client,
                    lambda c=client: (
                        states(c, sid)[-2:] == ["running", "idle:end_turn"]  # type: ignore[misc]
                        and agent_shown(c, sid, "from the phone") == 1
                    ),
                )
        # Every window shows the turn once: its user message, then its text; then the holder's.
        for client in (holder, phone, laptop):
            await until(client, lambda c=client: agent_shown(c, sid, "after") == 1)  # type: ignore[misc]
            assert user_shown(client, sid, "/echo from the phone") == 1, client.updates(sid)
            assert agent_shown(client, sid, "from the phone") == 1
            if windows.version == 2:
                await until(client, lambda c=client: len(states(c, sid)) >= 6)  # type: ignore[misc]
                # Each turn framed whole, one after the other, in every window.
                assert states(client, sid)[-6:] == ["running", "idle:end_turn"] * 3
            else:
                assert windows.agent_text(client, sid) == "steered: gofrom the phoneafter"
        if windows.version == 1:
            assert (await answered(holder, after))["result"]["stopReason"] == "end_turn"
            assert answer_index(holder, running) < answer_index(holder, after)
            assert update_position(holder, sid, "from the phone") < update_position(
                holder, sid, "after"
            )
        await until(holder, lambda: queue_changes(holder, sid)[-1:] == [[]])
        await until(laptop, lambda: queue_changes(laptop, sid)[-1:] == [[]])


async def test_an_observers_prompt_on_an_idle_session_runs_at_once_and_it_steers(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as holder, windows.window() as phone:
        sid = await windows.new(holder, project)
        await windows.observe(phone, sid, project)
        answer = await phone.call(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": "/echo at once"}]},
        )
        if windows.version == 1:
            assert answer["stopReason"] == "end_turn"
            assert windows.agent_text(phone, sid) == "at once"
        else:
            assert answer["messageId"]
            await until(phone, lambda: states(phone, sid)[-1:] == ["idle:end_turn"])
        await until(holder, lambda: windows.agent_text(holder, sid) == "at once")
        assert user_shown(holder, sid, "/echo at once") == 1
        assert user_shown(phone, sid, "/echo at once") == 1
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        assert lease.model_locked
        # The holder is shown the model locked by the phone's first message.
        assert "Locked once the session has history" in json.dumps(holder.updates(sid))
        # Its steering joins the holder's running turn.
        running = await windows.prompt(holder, sid, "/listen")
        await wait_running(windows.harness)
        steer = {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}
        assert await phone.call(STEER, steer) == {"outcome": "injected"}
        if windows.version == 1:
            assert (await answered(holder, running))["result"]["stopReason"] == "end_turn"
        await until(holder, lambda: windows.agent_text(holder, sid) == "at oncesteered: go")
        await until(phone, lambda: windows.agent_text(phone, sid) == "at oncesteered: go")
        # With no turn running, its steering message starts one that every window sees.
        await until(holder, lambda: lease.active_run is None)
        started = await phone.call(
            STEER, {"sessionId": sid, "prompt": [{"type": "text", "text": "/echo steered"}]}
        )
        assert started["outcome"] == "startedNewTurn"
        for client in (holder, phone):
            await until(client, lambda c=client: agent_shown(c, sid, "steered") == 2)  # type: ignore[misc]
            assert user_shown(client, sid, "/echo steered") == 1
        # The window that sent it is told the turn ended, as the holder is for its own.
        if windows.version == 1:
            await until(
                phone,
                lambda: any(
                    (u.get("_meta") or {}).get("steering", {}).get("turnEnded")
                    for u in phone.updates(sid)
                ),
            )
        else:
            await until(phone, lambda: states(phone, sid)[-1:] == ["idle:end_turn"])


async def test_an_observers_cancel_withdraws_every_waiting_prompt_and_ends_the_turn(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as holder, windows.window() as phone:
        sid = await windows.new(holder, project)
        await windows.observe(phone, sid, project)
        running = await windows.prompt(holder, sid, "/hang")
        await wait_running(windows.harness)
        mine = await windows.prompt(holder, sid, "/echo mine")
        await until(holder, lambda: len((queue_changes(holder, sid) or [[]])[-1]) == 1)
        theirs = await windows.prompt(phone, sid, "/echo theirs")
        await until(phone, lambda: len((queue_changes(phone, sid) or [[]])[-1]) == 2)
        await phone.cancel(sid)
        # Each window answers its own withdrawn prompts at once: none waits for another's.
        with trio.fail_after(CLOSE_DEADLINE_S / 2):
            withdrawn = [await answered(holder, mine), await answered(phone, theirs)]
        if windows.version == 1:
            assert [a["result"]["stopReason"] for a in withdrawn] == ["cancelled"] * 2
            assert (await answered(holder, running))["result"]["stopReason"] == "cancelled"
        else:
            assert [a["error"]["code"] for a in withdrawn] == [REQUEST_CANCELLED] * 2
            await until(holder, lambda: states(holder, sid)[-1:] == ["idle:cancelled"])
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        await until(holder, lambda: lease.active_run is None)
        assert lease.queued_prompts == ()
        assert agent_shown(holder, sid, "mine") == 0
        assert agent_shown(phone, sid, "theirs") == 0


async def test_the_holders_end_answers_an_observers_waiting_prompt_cancelled(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as phone:
        connection = await windows.harness.open_connection(schema=windows.schema)
        holder = connection.client
        await windows.initialize(holder)
        sid = await windows.new(holder, project)
        await windows.observe(phone, sid, project)
        await windows.prompt(holder, sid, "/hang")
        await wait_running(windows.harness)
        waiting = await windows.prompt(phone, sid, "/echo too late")
        await until(phone, lambda: len((queue_changes(phone, sid) or [[]])[-1]) == 1)
        before = len(phone.updates(sid))
        await connection.disconnect()
        answer = await answered(phone, waiting)
        if windows.version == 1:
            assert answer["result"]["stopReason"] == "cancelled"
        else:
            assert answer["error"]["code"] == REQUEST_CANCELLED
        # Then told it no longer follows, and the session is gone for it.
        await until(
            phone,
            lambda: any(
                "no longer follows the session" in json.dumps(u)
                for u in phone.updates(sid)[before:]
            ),
        )
        assert agent_shown(phone, sid, "too late") == 0
        await until(phone, lambda: windows.harness.runtime.lease_of(sid) is None)
        holder.validate(windows.schema)


async def test_a_waiting_observers_prompt_leaves_the_queue_on_its_own_windows_remove(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as holder, windows.window() as phone:
        sid = await windows.new(holder, project)
        await windows.observe(phone, sid, project)
        running = await windows.prompt(holder, sid, "/listen")
        await wait_running(windows.harness)
        waiting = await windows.prompt(phone, sid, "/echo never")
        await until(phone, lambda: len((queue_changes(phone, sid) or [[]])[-1]) == 1)
        (entry,) = (await phone.call(QUEUE, {"sessionId": sid, "action": "list"}))["entries"]
        await phone.call(QUEUE, {"sessionId": sid, "action": "remove", "entryId": entry["entryId"]})
        answer = await answered(phone, waiting)
        if windows.version == 1:
            assert answer["result"]["stopReason"] == "cancelled"
        else:
            assert answer["error"]["code"] == REQUEST_CANCELLED
        await until(holder, lambda: queue_changes(holder, sid)[-1:] == [[]])
        await holder.call(STEER, {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
        if windows.version == 1:
            assert (await answered(holder, running))["result"]["stopReason"] == "end_turn"
        with trio.fail_after(10):
            await holder.wait_until(lambda: windows.agent_text(holder, sid) == "steered: go")
        assert agent_shown(phone, sid, "never") == 0
