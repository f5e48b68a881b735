"""The per-connection session cap over the wire: the open past it answers ``-32600`` with a
clear message before anything is persisted, and the connection stays usable."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig, ConfigError
from maple_acp.edge._sessions import MAX_SESSIONS_PER_CONNECTION
from maple_acp.testing.client import AcpTestClient
from maple_acp.wire import ProtocolError


def _task_rows(harness: Harness) -> int:
    with sqlite3.connect(f"file:{harness.store_path}?mode=ro", uri=True) as conn:
        count: int = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    return count


async def _refused(call: Any, cap: int) -> None:
    with pytest.raises(ProtocolError) as info:
        await call
    assert info.value.code == -32600
    assert info.value.message == f"this connection already holds {cap} sessions; close some first"


async def _open_many(client: AcpTestClient, project: Path, count: int) -> list[str]:
    """``count`` sessions, opened concurrently (the cap must hold under concurrency too)."""
    sids: list[str] = []

    async def open_one() -> None:
        sids.append((await client.new_session(str(project)))["sessionId"])

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(open_one)
    return sids


@pytest.mark.parametrize("cap", [4, None], ids=["config-4", "default-256"])
async def test_an_open_past_the_cap_is_refused_and_the_connection_stays_usable(
    tmp_path: Path, project: Path, cap: int | None
) -> None:
    config = (
        AcpServiceConfig() if cap is None else AcpServiceConfig(max_sessions_per_connection=cap)
    )
    limit = cap or MAX_SESSIONS_PER_CONNECTION
    async with (
        running_service(tmp_path, config=config) as harness,
        harness.connect(initialize=True) as client,
        harness.connect(initialize=True) as other,
    ):
        sids = await _open_many(client, project, limit)
        # A durable task elsewhere, for the load and resume below.
        elsewhere = (await other.new_session(str(project)))["sessionId"]
        await other.prompt(elsewhere, "/echo kept")
        await other.close_session(elsewhere)
        rows = _task_rows(harness)

        await _refused(client.new_session(str(project)), limit)
        await _refused(client.load_session(elsewhere, str(project)), limit)
        await _refused(client.resume_session(elsewhere, str(project)), limit)
        # Nothing was created, persisted or leased for the refused opens.
        assert _task_rows(harness) == rows
        assert harness.runtime.lease_of(elsewhere) is None
        assert harness.runtime.status().leases == limit

        # Still usable: a held session answers, a re-attach is no new session.
        assert (await client.prompt(sids[0], "/echo still here"))["stopReason"] == "end_turn"
        await client.load_session(sids[0], str(project))
        # Closing one makes room for exactly one more.
        await client.close_session(sids[-1])
        await client.load_session(elsewhere, str(project))
        await _refused(client.new_session(str(project)), limit)


async def test_concurrent_opens_cannot_overshoot_the_cap(tmp_path: Path, project: Path) -> None:
    config = AcpServiceConfig(max_sessions_per_connection=4)
    async with (
        running_service(tmp_path, config=config) as harness,
        harness.connect(initialize=True) as client,
    ):
        opened: list[str] = []
        refused: list[int] = []

        async def open_one() -> None:
            try:
                opened.append((await client.new_session(str(project)))["sessionId"])
            except ProtocolError as exc:
                refused.append(exc.code)

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(open_one)
        assert len(opened) == 4
        assert refused == [-32600] * 6
        assert _task_rows(harness) == 4


@pytest.mark.parametrize("value", [0, MAX_SESSIONS_PER_CONNECTION + 1, True, "4"])
def test_the_cap_is_configurable_only_downward(value: Any) -> None:
    with pytest.raises(ConfigError):
        AcpServiceConfig(max_sessions_per_connection=value)
    assert AcpServiceConfig(max_sessions_per_connection=1).max_sessions_per_connection == 1
