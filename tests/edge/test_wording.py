"""Every refusal a client can meet speaks of sessions, never of the runtime's tasks: each
runtime rejection reachable over ACP is triggered over a real socket and its message read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError


async def _message(call: Any) -> str:
    with pytest.raises(ProtocolError) as info:
        await call
    return info.value.message


async def test_no_refusal_names_a_task(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = AcpServiceConfig(allow_session_delete=True)
    messages: dict[str, str] = {}
    async with (
        running_service(tmp_path, config=config) as harness,
        harness.connect(initialize=True) as owner,
        harness.connect(initialize=True) as other,
    ):
        sid = (await owner.new_session(str(project)))["sessionId"]
        await owner.prompt(sid, "/echo hello")
        messages["unknown"] = await _message(other.load_session("f" * 32, str(project)))
        messages["held"] = await _message(other.load_session(sid, str(project)))
        messages["held delete"] = await _message(other.delete_session(sid))
        messages["root"] = await _message(owner.load_session(sid, str(elsewhere)))
        messages["locked"] = await _message(
            owner.call(
                "session/set_config_option",
                {"sessionId": sid, "configId": "model", "value": "demo-echo-large"},
            )
        )
        messages["unknown model"] = await _message(
            owner.call(
                "session/set_config_option",
                {"sessionId": sid, "configId": "model", "value": "no-such-model"},
            )
        )
        messages["goal state"] = await _message(
            owner.call("_session/goal", {"sessionId": sid, "action": "pause"})
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(owner.prompt, sid, "/echo started\n/hang")
            await owner.wait_until(lambda: owner.text(sid).endswith("started"))
            messages["running"] = await _message(owner.delete_session(sid))
            await owner.cancel(sid)
        await owner.close_session(sid)
        harness.runtime.sign_in("someone-else")
        messages["another account"] = await _message(other.load_session(sid, str(project)))
        owner.validate(acp_schema)
        other.validate(acp_schema)
    assert len(messages) == 9
    for what, message in messages.items():
        assert not re.search(r"\btasks?\b", message, re.IGNORECASE), (what, message)
    # An unknown id and another account's look alike: no existence oracle.
    assert messages["another account"] == messages["unknown"]


async def test_a_held_session_names_the_client_holding_it_and_how_to_free_it(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with (
        running_service(tmp_path) as harness,
        harness.connect() as owner,
        harness.connect() as other,
        harness.connect() as anonymous,
    ):
        await owner.initialize(clientInfo={"name": "zed\nforged line", "version": "1.0"})
        await other.initialize(clientInfo={"name": "acpx", "version": "0.19.1"})
        await anonymous.initialize()
        sid = (await owner.new_session(str(project)))["sessionId"]
        held = await _message(other.load_session(sid, str(project)))
        assert held == (
            "the session is open in zed forged line; close it there (or quit that client) "
            "to open it here"
        )
        assert await _message(other.resume_session(sid, str(project))) == held
        # A session held by a client that gave no name is "another client".
        sid2 = (await anonymous.new_session(str(project)))["sessionId"]
        assert (await _message(other.load_session(sid2, str(project)))).startswith(
            "the session is open in another client; close it there"
        )
        other.validate(acp_schema)


async def test_a_never_prompted_session_whose_grace_ran_out_says_it_expired(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    """acpx makes a session in one process and prompts it from the next; after the grace
    period the answer says the session expired, with the why in ``data``."""
    async with running_service(tmp_path) as harness:
        async with harness.connect(initialize=True) as first:
            sid = (await first.new_session(str(project)))["sessionId"]
        await harness.runtime.store.set_provisional_expiry(sid, 0)
        assert sid in await harness.runtime.sweep_provisional()
        async with harness.connect(initialize=True) as later:
            for call in (later.load_session, later.resume_session):
                with pytest.raises(ProtocolError) as gone:
                    await call(sid, str(project))
                assert gone.value.message == f"session {sid} expired before its first prompt"
                assert gone.value.data["sessionId"] == sid
                assert gone.value.data["detail"].startswith(
                    "a session that was never prompted is kept 600 s after its client disconnects"
                )
            # An id that never existed still reads as unknown.
            with pytest.raises(ProtocolError) as unknown:
                await later.load_session("f" * 32, str(project))
            assert "expired" not in unknown.value.message
            later.validate(acp_schema)
