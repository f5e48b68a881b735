"""Requests a client writes back to back, each after one that ends what the next one needs:
a load or resume right after a close of the same session, a prompt right after a cancel.
Wire order admits the first; the second waits for it to finish, then decides, as it would
have one request at a time. Never a refusal for a state the client already asked to end."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient
from maple_acp.wire import ProtocolError

RESOURCE_NOT_FOUND = -32002

_ids = itertools.count()


def request(method: str, params: dict[str, Any]) -> tuple[str, bytes]:
    msg_id = f"b{next(_ids)}"
    line = orjson.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return msg_id, line + b"\n"


def notification(method: str, params: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n"


async def answers(client: AcpTestClient, ids: list[str]) -> list[dict[str, Any]]:
    def got() -> dict[Any, Any]:
        return {
            f.message["id"]: f.message
            for f in client.frames
            if f.direction == "in"
            and isinstance(f.message, dict)
            and "method" not in f.message
            and f.message.get("id") in ids
        }

    with trio.fail_after(20):
        await client.wait_until(lambda: len(got()) == len(ids))
    found = got()
    return [found[i] for i in ids]


def prompt_params(sid: str, text: str) -> dict[str, Any]:
    return {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}


async def test_a_load_written_right_after_a_close_waits_for_it_and_loads(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo kept")
        for method in ("session/load", "session/resume") * 10:
            close_id, close = request("session/close", {"sessionId": sid})
            open_id, opened = request(
                method, {"sessionId": sid, "cwd": str(project), "mcpServers": []}
            )
            await client.peer.notify_lines([close, opened])
            closed, loaded = await answers(client, [close_id, open_id])
            assert closed.get("result") == {}, closed
            assert "result" in loaded, (method, loaded)
            # The session is open here again, and works.
            assert (await client.prompt(sid, "/echo again"))["stopReason"] == "end_turn"


async def test_a_load_right_after_a_close_of_a_running_turn_waits_for_the_turn_to_end(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo kept")
        prompt_id, prompt = request("session/prompt", prompt_params(sid, "/hang"))
        await client.peer.notify_lines([prompt])
        await client.wait_until(lambda: any(u.get("sessionUpdate") for u in client.updates(sid)))
        close_id, close = request("session/close", {"sessionId": sid})
        load_id, load = request(
            "session/load", {"sessionId": sid, "cwd": str(project), "mcpServers": []}
        )
        await client.peer.notify_lines([close, load])
        prompted, closed, loaded = await answers(client, [prompt_id, close_id, load_id])
        assert prompted["result"]["stopReason"] == "cancelled"
        assert closed.get("result") == {}
        assert "result" in loaded, loaded


async def test_a_load_on_another_connection_after_the_close_finished_loads(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as first, harness.connect(initialize=True) as other:
        sid = (await first.new_session(str(project)))["sessionId"]
        await first.prompt(sid, "/echo kept")
        for _ in range(10):
            await first.close_session(sid)
            assert await other.load_session(sid, str(project))
            await other.close_session(sid)
            assert await first.resume_session(sid, str(project)) is not None


async def test_a_prompt_written_right_after_a_cancel_runs_once_the_cancelled_turn_ended(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        for round_ in range(20):
            hang_id, hang = request("session/prompt", prompt_params(sid, "/hang"))
            await client.peer.notify_lines([hang])
            # The turn is running (its user message was echoed or its run began).
            await client.wait_until(
                lambda: (
                    sum(1 for f in client.frames if f.direction == "in") > 0
                    and bool(client.updates(sid))
                )
            )
            next_id, following = request("session/prompt", prompt_params(sid, f"/echo n{round_}"))
            await client.peer.notify_lines(
                [notification("session/cancel", {"sessionId": sid}), following]
            )
            cancelled, ran = await answers(client, [hang_id, next_id])
            assert cancelled["result"]["stopReason"] == "cancelled"
            assert ran.get("result", {}).get("stopReason") == "end_turn", ran
            assert client.text(sid).endswith(f"n{round_}")


async def test_a_never_prompted_session_closed_by_a_connection_that_loaded_it_is_removed(
    harness: Harness, project: Path
) -> None:
    # acpx's split: one connection creates the session, another loads it; a close from the
    # holder ends an untouched session as a close from its creator does.
    async with harness.connect(initialize=True) as creator:
        sid = (await creator.new_session(str(project)))["sessionId"]
    assert await harness.runtime.store.get_task(sid) is not None  # its grace period
    async with harness.connect(initialize=True) as loader:
        await loader.load_session(sid, str(project))
        assert await loader.close_session(sid) == {}
        assert await harness.runtime.store.get_task(sid) is None
        ids = [s["sessionId"] for s in (await loader.list_sessions())["sessions"]]
        assert sid not in ids
        with pytest.raises(ProtocolError) as refused:
            await loader.load_session(sid, str(project))
        assert refused.value.code == RESOURCE_NOT_FOUND


async def test_a_prompted_session_closed_by_a_connection_that_loaded_it_is_kept(
    harness: Harness, project: Path
) -> None:
    async with harness.connect(initialize=True) as creator:
        sid = (await creator.new_session(str(project)))["sessionId"]
        await creator.prompt(sid, "/echo kept")
    async with harness.connect(initialize=True) as loader:
        await loader.load_session(sid, str(project))
        assert await loader.close_session(sid) == {}
        assert await loader.load_session(sid, str(project)) is not None


async def test_on_v2_a_prompt_written_right_after_a_cancel_is_accepted_and_runs(
    tmp_path: Path,
) -> None:
    # v2 answers a prompt once its message is inserted: the second prompt is accepted (never
    # -32600) once the cancelled turn ended, and its own turn runs to its end.
    project = tmp_path / "project"
    project.mkdir()
    v2 = {"protocolVersion": 2, "info": {"name": "t", "version": "0"}, "capabilities": {}}
    config = AcpServiceConfig(protocol_max=2)
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        await client.call("initialize", v2)
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        for round_ in range(10):
            hang_id, hang = request("session/prompt", prompt_params(sid, "/hang"))
            await client.peer.notify_lines([hang])
            (hung,) = await answers(client, [hang_id])
            assert hung["result"]["messageId"]
            next_id, following = request("session/prompt", prompt_params(sid, f"/echo v{round_}"))
            since = len(client.frames)
            await client.peer.notify_lines(
                [notification("session/cancel", {"sessionId": sid}), following]
            )
            (accepted,) = await answers(client, [next_id])
            assert accepted.get("result", {}).get("messageId"), accepted
            said = ("agent_message", f"v{round_}")

            def ran(said: tuple[str, str] = said, since: int = since) -> bool:
                # Its text came, and both turns ended (v2 says so: the state turns idle).
                idle = sum(
                    1
                    for f in client.frames[since:]
                    if f.direction == "in"
                    and b'"state_update"' in f.raw
                    and f.message["params"]["update"].get("state") == "idle"
                )
                return idle >= 2 and said in {(k, t) for k, _, t in client.messages(sid)}

            with trio.fail_after(10):
                await client.wait_until(ran)
