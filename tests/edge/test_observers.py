"""Several windows on one session: a second connection follows a session another holds
(``_meta["maple.attach"] = "observe"`` on ``session/load`` in v1, ``session/resume`` with a
replay in v2). Through the real wire on both versions, every frame checked against the
schema of the negotiated version as it arrives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service
from line_client import LineClient, socket_pair_for

from maple_acp.edge import AcpServiceConfig
from maple_acp.runtime import MAX_OBSERVERS, OBSERVER_BACKLOG
from maple_acp.testing.client import AcpTestClient, HeldPermissions
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

ATTACH = "maple.attach"


class Windows:
    """Clients of one version on one service, and what each version calls things."""

    def __init__(self, harness: Harness, version: int, schema: AcpSchema) -> None:
        self.harness = harness
        self.version = version
        self.schema = schema

    @asynccontextmanager
    async def window(self, name: str = "", **options: Any) -> AsyncIterator[AcpTestClient]:
        async with self.harness.connect(schema=self.schema, **options) as client:
            await self.initialize(client, name)
            yield client
            client.check()
            client.validate(self.schema)

    async def initialize(self, client: AcpTestClient, name: str = "") -> None:
        params: dict[str, Any] = {"protocolVersion": self.version, "clientCapabilities": {}}
        if name:
            params["clientInfo"] = {"name": name, "version": "1"}
        answer = await client.call("initialize", params)
        assert answer["protocolVersion"] == self.version

    async def new(self, client: AcpTestClient, cwd: Path) -> str:
        params: dict[str, Any] = {"cwd": str(cwd)}
        if self.version == 1:
            params["mcpServers"] = []
        sid: str = (await client.call("session/new", params))["sessionId"]
        return sid

    def attach_params(self, sid: str, cwd: Path, meta: dict[str, Any] | None) -> tuple[str, Any]:
        params: dict[str, Any] = {"sessionId": sid, "cwd": str(cwd), "mcpServers": []}
        if meta is not None:
            params["_meta"] = meta
        if self.version == 1:
            return "session/load", params
        params["replayFrom"] = {"type": "start"}
        return "session/resume", params

    async def observe(
        self, client: AcpTestClient, sid: str, cwd: Path, value: Any = "observe"
    ) -> Any:
        return await client.call(*self.attach_params(sid, cwd, {ATTACH: value}))

    def agent_text(self, client: AcpTestClient, sid: str) -> str:
        """The agent's text of the session as this client shows it."""
        if self.version == 1:
            return client.text(sid)
        return "".join(t for kind, _, t in client.messages(sid) if kind == "agent_message")

    def user_texts(self, client: AcpTestClient, sid: str) -> list[str]:
        if self.version == 1:
            return [
                u["content"]["text"]
                for u in client.updates(sid)
                if u["sessionUpdate"] == "user_message_chunk"
            ]
        return [t for kind, _, t in client.messages(sid) if kind == "user_message"]

    async def prompt(self, client: AcpTestClient, sid: str, text: str) -> str:
        """Write a prompt without waiting for its answer."""
        return await client.send(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
        )


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


async def until(client: AcpTestClient, predicate: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        await client.wait_until(predicate)


def cancel_requests(client: AcpTestClient) -> list[Any]:
    return [
        m["params"]["requestId"]
        for m in client.inbound()
        if isinstance(m, dict) and m.get("method") == "$/cancel_request"
    ]


def tool_rows(client: AcpTestClient, sid: str, tool_id: str) -> list[dict[str, Any]]:
    return [u for u in client.updates(sid) if u.get("toolCallId") == tool_id]


def shell(marker: Path) -> str:
    return "/tool shell " + json.dumps({"command": f"touch {marker}"})


async def test_an_observer_gets_the_replay_then_every_live_update(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as holder, windows.window() as observer:
        sid = await windows.new(holder, project)
        await holder.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "/echo one"}]}
        )
        await until(holder, lambda: windows.agent_text(holder, sid) == "one")
        if windows.version == 2:
            # Answered on acceptance: the next prompt waits until this turn is over.
            await until(holder, lambda: states(holder, sid)[-1:] == ["idle:end_turn"])
        await windows.observe(observer, sid, project)
        assert windows.agent_text(observer, sid) == "one"
        # The holder keeps the lease.
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        assert lease.observers == 1
        await windows.prompt(holder, sid, "/echo two")
        await until(observer, lambda: windows.agent_text(observer, sid) == "onetwo")
        assert windows.user_texts(observer, sid) == ["/echo one", "/echo two"]
        if windows.version == 2:
            # The turn framed as the holder's is, and nothing live before the replay's end.
            await until(observer, lambda: states(observer, sid)[-1:] == ["idle:end_turn"])
            assert states(observer, sid) == ["idle", "running", "idle:end_turn"]
            updates = observer.updates(sid)
            kinds = [u["sessionUpdate"] for u in updates]
            assert kinds.count("replay_complete") == 1
            running = next(i for i, u in enumerate(updates) if u.get("state") == "running")
            assert kinds.index("replay_complete") < running
        await until(holder, lambda: windows.agent_text(holder, sid) == "onetwo")


async def test_a_running_turns_output_so_far_is_replayed_once(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as holder, windows.window() as observer:
        sid = await windows.new(holder, project)
        prompt_id = await windows.prompt(holder, sid, "/echo so far\n/hang")
        await until(holder, lambda: windows.agent_text(holder, sid) == "so far")
        await windows.observe(observer, sid, project)
        assert windows.agent_text(observer, sid) == "so far"
        assert windows.user_texts(observer, sid) == ["/echo so far\n/hang"]
        # The observer's cancel ends the holder's turn; nothing it had shown comes again.
        await observer.cancel(sid)
        await turn_over(windows, holder, sid, prompt_id)
        if windows.version == 2:
            await until(observer, lambda: "idle:cancelled" in states(observer, sid))
        assert windows.agent_text(observer, sid) == "so far"
        assert windows.user_texts(observer, sid) == ["/echo so far\n/hang"]


async def turn_over(windows: Windows, client: AcpTestClient, sid: str, prompt_id: str) -> None:
    """Until the turn of the prompt ``prompt_id`` ended, as the holder sees it."""
    if windows.version == 1:
        await until(client, lambda: client.answer(prompt_id) is not None)
    else:
        await until(client, lambda: any(s.startswith("idle:") for s in states(client, sid)))


def states(client: AcpTestClient, sid: str) -> list[str]:
    return [
        u["state"] + (f":{u['stopReason']}" if u.get("stopReason") else "")
        for u in client.updates(sid)
        if u["sessionUpdate"] == "state_update"
    ]


@pytest.mark.parametrize(
    ("first", "decision", "made"),
    [("holder", "allow", True), ("observer", "allow", True), ("observer", "reject", False)],
)
async def test_the_first_window_to_answer_decides_the_others_are_withdrawn(
    windows: Windows, project: Path, first: str, decision: str, made: bool
) -> None:
    held = {"holder": HeldPermissions(), "observer": HeldPermissions()}
    async with (
        windows.window(permission=held["holder"]) as holder,
        windows.window(permission=held["observer"]) as observer,
    ):
        clients = {"holder": holder, "observer": observer}
        sid = await windows.new(holder, project)
        await windows.observe(observer, sid, project)
        marker = project / "marker"
        prompt_id = await windows.prompt(holder, sid, shell(marker))
        with trio.fail_after(10):
            await held["holder"].wait_pending()
            await held["observer"].wait_pending()
        params = held[first].answer_next(decision)
        tool_id = (
            params["toolCall"]["toolCallId"]
            if windows.version == 1
            else (params["subject"]["toolCall"]["toolCallId"])
        )
        other = "observer" if first == "holder" else "holder"
        loser = clients[other]
        # The other window's question is withdrawn, and it sees the call as decided.
        await until(loser, lambda: len(cancel_requests(loser)) == 1)
        await until(loser, lambda: bool(tool_rows(loser, sid, tool_id)))
        await turn_over(windows, holder, sid, prompt_id)
        assert marker.exists() is made
        assert cancel_requests(clients[first]) == [], clients[first].inbound()
        final = tool_rows(loser, sid, tool_id)[-1]["status"]
        assert final == ("completed" if made else "failed")


async def test_a_cancelled_answer_from_one_window_waits_for_another(
    windows: Windows, project: Path
) -> None:
    held = {"holder": HeldPermissions(), "observer": HeldPermissions()}
    async with (
        windows.window(permission=held["holder"]) as holder,
        windows.window(permission=held["observer"]) as observer,
    ):
        sid = await windows.new(holder, project)
        await windows.observe(observer, sid, project)
        marker = project / "marker"
        prompt_id = await windows.prompt(holder, sid, shell(marker))
        with trio.fail_after(10):
            await held["holder"].wait_pending()
            await held["observer"].wait_pending()
        held["holder"].answer_next("cancel")
        # Ignored while the observer can still answer: the question waits.
        await trio.testing.wait_all_tasks_blocked()
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        run = lease.active_run
        assert run is not None
        assert run.pending_permissions
        held["observer"].answer_next("allow")
        await turn_over(windows, holder, sid, prompt_id)
        assert marker.exists()


async def test_with_every_window_gone_the_question_is_denied(
    windows: Windows, project: Path
) -> None:
    held = {"holder": HeldPermissions(), "observer": HeldPermissions()}
    async with windows.window(permission=held["holder"]) as holder:
        sid = await windows.new(holder, project)
        connection = await windows.harness.open_connection(
            permission=held["observer"], schema=windows.schema
        )
        await windows.initialize(connection.client)
        await windows.observe(connection.client, sid, project)
        marker = project / "marker"
        prompt_id = await windows.prompt(holder, sid, shell(marker))
        with trio.fail_after(10):
            await held["holder"].wait_pending()
            await held["observer"].wait_pending()
        # The observer goes away: only detached (the holder's turn goes on, the lease is its).
        await connection.disconnect()
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        assert lease.observers == 0
        assert not lease.revoked
        run = lease.active_run
        assert run is not None
        assert run.pending_permissions
        held["holder"].answer_next("cancel")
        await turn_over(windows, holder, sid, prompt_id)
        assert not marker.exists()
        connection.client.validate(windows.schema)


@pytest.mark.parametrize("how", ["disconnect", "close"])
async def test_the_holders_end_detaches_observers_with_a_notice(
    windows: Windows, project: Path, how: str
) -> None:
    async with windows.window() as observer:
        connection = await windows.harness.open_connection(schema=windows.schema)
        holder = connection.client
        await windows.initialize(holder)
        sid = await windows.new(holder, project)
        await windows.observe(observer, sid, project)
        before = len(observer.updates(sid))
        if how == "close":
            assert await holder.close_session(sid) == {}
        await connection.disconnect()
        await until(observer, lambda: len(observer.updates(sid)) > before)
        (notice,) = observer.updates(sid)[before:]
        shown = notice.get("title") or notice.get("content", {}).get("text", "")
        assert "no longer follows the session" in shown
        # Gone for the observer's connection: it is not told about it again.
        with pytest.raises(ProtocolError) as refused:
            await observer.close_session(sid)
        assert refused.value.code == -32002
        holder.validate(windows.schema)


async def test_an_observers_close_detaches_it_only(windows: Windows, project: Path) -> None:
    async with windows.window() as holder, windows.window() as observer:
        sid = await windows.new(holder, project)
        await windows.observe(observer, sid, project)
        assert await observer.close_session(sid) == {}
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        assert lease.observers == 0
        assert not lease.revoked
        await holder.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "/echo on"}]}
        )
        await until(holder, lambda: windows.agent_text(holder, sid) == "on")
        # It may follow again.
        await windows.observe(observer, sid, project)
        assert lease.observers == 1


async def test_at_most_four_observers(windows: Windows, project: Path) -> None:
    async with windows.window() as holder:
        sid = await windows.new(holder, project)
        observers = [
            await windows.harness.open_connection(schema=windows.schema)
            for _ in range(MAX_OBSERVERS + 1)
        ]
        for connection in observers:
            await windows.initialize(connection.client)
        for connection in observers[:MAX_OBSERVERS]:
            await windows.observe(connection.client, sid, project)
        with pytest.raises(ProtocolError) as refused:
            await windows.observe(observers[-1].client, sid, project)
        assert refused.value.code == -32600
        assert "4" in refused.value.message
        # Every window gets every live update.
        await windows.prompt(holder, sid, "/echo to all")
        for connection in observers[:MAX_OBSERVERS]:
            client = connection.client
            await until(client, lambda c=client: windows.agent_text(c, sid) == "to all")  # type: ignore[misc]
        assert windows.agent_text(observers[-1].client, sid) == ""
        for connection in observers:
            await connection.disconnect()
            connection.client.validate(windows.schema)


@pytest.mark.parametrize("value", ["hold", "", 1, None, {"observe": True}])
async def test_any_other_attach_value_is_bad_params(
    windows: Windows, project: Path, value: Any
) -> None:
    async with windows.window() as holder, windows.window() as other:
        sid = await windows.new(holder, project)
        with pytest.raises(ProtocolError) as refused:
            await windows.observe(other, sid, project, value)
        assert refused.value.code == -32602
        assert ATTACH in refused.value.message


async def test_without_the_key_a_held_session_is_refused(windows: Windows, project: Path) -> None:
    # The following window connects first: the holder is not the first connection found.
    async with (
        windows.window("phone") as observer,
        windows.window("desk") as holder,
        windows.window() as other,
    ):
        sid = await windows.new(holder, project)
        await windows.observe(observer, sid, project)
        with pytest.raises(ProtocolError) as refused:
            await other.call(*windows.attach_params(sid, project, None))
        assert refused.value.code == -32600
        # The client holding it is named (a v1 client's name), not one that only follows it.
        assert "open in" in refused.value.message
        assert "phone" not in refused.value.message
        if windows.version == 1:
            assert "open in desk;" in refused.value.message
        # An observer's own load without the key: it follows the session already.
        with pytest.raises(ProtocolError) as again:
            await observer.call(*windows.attach_params(sid, project, None))
        assert again.value.code == -32600


async def test_an_observers_prompt_and_steering_are_taken_like_the_holders(
    windows: Windows, project: Path
) -> None:
    # They were refused (-32600) while prompts could not wait for their turn.
    async with windows.window() as holder, windows.window() as observer:
        sid = await windows.new(holder, project)
        await windows.observe(observer, sid, project)
        answer = await observer.call(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": "/echo from the phone"}]},
        )
        assert ("stopReason" if windows.version == 1 else "messageId") in answer
        await until(holder, lambda: windows.agent_text(holder, sid) == "from the phone")
        steer = {"sessionId": sid, "prompt": [{"type": "text", "text": "/echo steer"}]}
        started = await observer.call("_session/steering", steer)
        assert started["outcome"] == "startedNewTurn"
        await until(holder, lambda: windows.agent_text(holder, sid) == "from the phonesteer")
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        assert lease.model_locked


async def test_a_question_whose_turn_is_cancelled_is_withdrawn(
    windows: Windows, project: Path
) -> None:
    held = HeldPermissions()
    async with windows.window(permission=held) as holder:
        sid = await windows.new(holder, project)
        marker = project / "marker"
        prompt_id = await windows.prompt(holder, sid, shell(marker))
        with trio.fail_after(10):
            await held.wait_pending()
        await holder.cancel(sid)
        await until(holder, lambda: len(cancel_requests(holder)) == 1)
        await turn_over(windows, holder, sid, prompt_id)
        assert not marker.exists()


async def test_a_window_attached_while_a_question_waits_can_answer_it(
    windows: Windows, project: Path
) -> None:
    held = {"holder": HeldPermissions(), "observer": HeldPermissions()}
    async with (
        windows.window(permission=held["holder"]) as holder,
        windows.window(permission=held["observer"]) as phone,
    ):
        sid = await windows.new(holder, project)
        marker = project / "marker"
        prompt_id = await windows.prompt(holder, sid, shell(marker))
        with trio.fail_after(10):
            await held["holder"].wait_pending()
        # The phone attaches while the desk's question waits, and answers it.
        await windows.observe(phone, sid, project)
        with trio.fail_after(10):
            await held["observer"].wait_pending()
        held["observer"].answer_next("allow")
        await until(holder, lambda: len(cancel_requests(holder)) == 1)
        await turn_over(windows, holder, sid, prompt_id)
        assert marker.exists()


async def test_a_window_that_stops_reading_never_holds_up_the_holder(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as holder, trio.open_nursery() as nursery:
        sid = await windows.new(holder, project)
        stalled = LineClient(socket_pair_for(windows.harness, nursery))
        initialize = {"protocolVersion": windows.version, "clientCapabilities": {}}
        await stalled.send("initialize", initialize)
        await stalled.read()
        attach_id = await stalled.send(*windows.attach_params(sid, project, {ATTACH: "observe"}))
        with trio.fail_after(10):
            while (await stalled.read()).get("id") != attach_id:
                pass
        lease = windows.harness.runtime.lease_of(sid)
        assert lease is not None
        assert lease.observers == 1
        # It reads nothing from here on; the holder's turn streams far past its credit.
        prompt_id = await windows.prompt(holder, sid, f"/stream {OBSERVER_BACKLOG * 2} 64")
        await turn_over(windows, holder, sid, prompt_id)
        assert len(windows.agent_text(holder, sid)) == OBSERVER_BACKLOG * 2 * 64
        assert lease.observers == 0
        await stalled.stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_mode_change_by_the_holder_reaches_the_observer(
    windows: Windows, project: Path
) -> None:
    async with windows.window() as holder, windows.window() as observer:
        sid = await windows.new(holder, project)
        await windows.observe(observer, sid, project)
        before = len(observer.updates(sid))
        change: dict[str, Any] = {"sessionId": sid, "configId": "mode", "value": "ask"}
        if windows.version == 2:
            change["type"] = "id"
        await holder.call("session/set_config_option", change)
        await until(observer, lambda: '"ask"' in json.dumps(observer.updates(sid)[before:]))


async def test_an_observers_delete_is_refused_and_it_still_follows(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    config = AcpServiceConfig(allow_session_delete=True)
    async with running_service(tmp_path, config=config) as harness:
        windows = Windows(harness, 1, acp_schema)
        async with windows.window("desk") as holder, windows.window() as observer:
            sid = await windows.new(holder, project)
            await windows.observe(observer, sid, project)
            with pytest.raises(ProtocolError) as refused:
                await observer.delete_session(sid)
            assert refused.value.code == -32600
            assert "open in desk" in refused.value.message
            lease = harness.runtime.lease_of(sid)
            assert lease is not None
            assert lease.observers == 1
            await windows.prompt(holder, sid, "/echo still")
            await until(observer, lambda: windows.agent_text(observer, sid) == "still")
