"""The five-second close rule and disconnect cleanup, on a virtual clock."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service

from maple_acp.edge import CLOSE_DEADLINE_S
from maple_acp.runtime import Turn
from maple_acp.testing.client import AcpTestClient
from maple_acp.wire import ProtocolError

#: How long the stalled backend ignores cancellation: well past the close deadline.
STALL_S = 60.0


class StallingBackend:
    """A backend whose turn ignores cancellation for a while, as a wedged provider might."""

    def __init__(self) -> None:
        self.started = trio.Event()
        self.finished = trio.Event()

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text("working")
        self.started.set()
        with trio.CancelScope(shield=True):
            await trio.sleep(STALL_S)
        self.finished.set()


def _updates_after(client: AcpTestClient, response_id: Any, sid: str) -> list[Any]:
    inbound = client.inbound()
    at = next(i for i, m in enumerate(inbound) if m.get("id") == response_id and "result" in m)
    return [
        m
        for m in inbound[at + 1 :]
        if m.get("method") == "session/update" and m["params"]["sessionId"] == sid
    ]


async def test_close_returns_at_the_deadline_and_keeps_a_tombstone(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    backend = StallingBackend()
    project = tmp_path / "project"
    project.mkdir()
    async with running_service(tmp_path, backend=backend) as harness, harness.connect() as client:
        if True:  # one block per phase: the stalled prompt, then the late calls
            sid = (await client.new_session(str(project)))["sessionId"]
            async with trio.open_nursery() as nursery:
                answers: list[Any] = []

                async def prompt() -> None:
                    answers.append(await client.prompt(sid, "stall"))

                nursery.start_soon(prompt)
                await backend.started.wait()
                before = trio.current_time()
                assert await client.close_session(sid) == {}
                assert trio.current_time() - before == pytest.approx(CLOSE_DEADLINE_S)
                # The close answered anyway; the prompt is answered too.
                await trio.testing.wait_all_tasks_blocked()
                assert [a["stopReason"] for a in answers] == ["cancelled"]
            # The tombstone: a late load is refused as closing, other late calls as unknown.
            with pytest.raises(ProtocolError) as late_load:
                await client.load_session(sid, str(project))
            assert late_load.value.code == -32600
            assert "closing" in late_load.value.message
            with pytest.raises(ProtocolError) as late_prompt:
                await client.prompt(sid, "again")
            assert late_prompt.value.code == -32002
            for method in ("session/set_mode", "session/set_config_option"):
                with pytest.raises(ProtocolError) as late:
                    await client.call(
                        method,
                        {
                            "sessionId": sid,
                            "modeId": "code",
                            "configId": "mode",
                            "value": "code",
                        },
                    )
                assert late.value.code == -32002
            close_id = next(
                m["id"] for m in client.outbound() if m.get("method") == "session/close"
            )
            assert _updates_after(client, close_id, sid) == []
            # Cleanup finishes later, in the background.
            await backend.finished.wait()
            await trio.sleep(CLOSE_DEADLINE_S)
            assert harness.runtime.lease_of(sid) is None
            assert harness.runtime.status().active_runs == 0
            # The task itself survives: it had an admitted message.
            assert await harness.runtime.store.get_task(sid) is not None


async def test_clean_close_is_quick_and_second_close_is_unknown(
    autojump_clock: trio.testing.MockClock, harness: Harness, project: Path
) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "hello")
        before = trio.current_time()
        await client.close_session(sid)
        assert trio.current_time() - before < CLOSE_DEADLINE_S
        with pytest.raises(ProtocolError) as second:
            await client.close_session(sid)
        assert second.value.code == -32002
        # A cleanly closed session can be loaded again (no tombstone).
        await client.load_session(sid, str(project))


async def test_close_during_permission_wait_denies(harness: Harness, project: Path) -> None:
    """Regression: close racing a pending permission answer must never let the tool run."""
    marker = project / "ran"
    asked = trio.Event()
    release = trio.Event()

    async def slow(params: Any) -> str:
        asked.set()
        await release.wait()
        return "allow"

    async with harness.connect(permission=slow) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.prompt, sid, f'/tool shell {{"command": "touch {marker}"}}')
            await asked.wait()
            await client.close_session(sid)
            release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not marker.exists()
        assert harness.runtime.lease_of(sid) is None


async def test_disconnect_revokes_everything(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    async with running_service(tmp_path, provisional_grace_s=600) as harness:
        async with harness.connect() as client:
            prompted = (await client.new_session(str(project)))["sessionId"]
            await client.prompt(prompted, "keep me")
            fresh = (await client.new_session(str(project)))["sessionId"]
            running = (await client.new_session(str(project)))["sessionId"]
            client_nursery_prompt = trio.Event()

            async def hang() -> None:
                client_nursery_prompt.set()
                with contextlib.suppress(Exception):
                    await client.prompt(running, "/echo started\n/hang")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hang)
                await client_nursery_prompt.wait()
                await client.wait_until(lambda: client.text(running) == "started")
                assert harness.runtime.status().active_runs == 1
                nursery.cancel_scope.cancel()
        # The client is gone: no lease, no run.
        await trio.testing.wait_all_tasks_blocked()
        status = harness.runtime.status()
        assert status.leases == 0
        assert status.active_runs == 0
        async with harness.connect() as other:
            listed = [s["sessionId"] for s in (await other.list_sessions())["sessions"]]
            assert prompted in listed
            assert running in listed
            assert fresh not in listed
            # Hidden but loadable by id within the grace period (create and prompt from two
            # processes, as some clients do).
            await other.load_session(fresh, str(project))
            assert (await other.prompt(fresh, "now prompted"))["stopReason"] == "end_turn"


@pytest.mark.parametrize("grace", [600, 0])
async def test_unprompted_task_is_deleted_once_its_grace_ends(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, grace: int
) -> None:
    """Kept (hidden) for the grace after a disconnect, then swept; a zero grace deletes it
    at the disconnect."""
    project = tmp_path / "project"
    project.mkdir()
    async with running_service(tmp_path, provisional_grace_s=grace) as harness:
        async with harness.connect() as client:
            fresh = (await client.new_session(str(project)))["sessionId"]
        await trio.testing.wait_all_tasks_blocked()
        kept = await harness.runtime.store.get_task(fresh)
        assert (kept is not None) == (grace > 0)
        await trio.sleep(grace + 120)
        assert await harness.runtime.store.get_task(fresh) is None


async def test_disconnect_during_load_replay(harness: Harness, project: Path) -> None:
    """Regression: the connection ends while history is being replayed."""
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/stream 400 100")
        await client.close_session(sid)
    client_end, service_end = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(harness.acp.serve_stream, service_end)
        load = (
            b'{"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"'
            + sid.encode()
            + b'","cwd":"'
            + str(project).encode()
            + b'","mcpServers":[]}}\n'
        )
        await client_end.send_all(load)
        # Read a little of the replay, then hang up in the middle of it.
        await client_end.receive_some(1000)
        await client_end.aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert harness.runtime.lease_of(sid) is None
    async with harness.connect() as client:
        await client.load_session(sid, str(project))


async def test_cancel_racing_the_last_update(harness: Harness, project: Path) -> None:
    """Regression: a cancel that lands while the run's last updates are still queued. The
    answer, cancelled or not, comes after every update of the turn."""
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        for _ in range(5):
            async with trio.open_nursery() as nursery:
                answers: list[Any] = []

                async def prompt(into: list[Any]) -> None:
                    into.append(await client.prompt(sid, "/stream 300 10"))

                nursery.start_soon(prompt, answers)
                await client.wait_until(lambda: "x" in client.text(sid))
                await client.cancel(sid)
            [answer] = answers
            assert answer["stopReason"] in ("cancelled", "end_turn")
            inbound = client.inbound()
            at = max(
                i
                for i, m in enumerate(inbound)
                if m.get("result") is answer or m.get("result") == answer
            )
            assert not any(
                m.get("method") == "session/update" and m["params"]["sessionId"] == sid
                for m in inbound[at + 1 :]
            )
            # The session is ready for the next turn at once.
            assert (await client.prompt(sid, "/echo next"))["stopReason"] == "end_turn"
