"""A backend that changes its commands mid-session: the client of a real connector process is
told at once, and only that session's list changes."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from maple_acp.edge import AcpService, AcpServiceConfig, HostLifecycle
from maple_acp.listeners import UnixListener
from maple_acp.runtime import (
    AgentService,
    AskForTools,
    CommandInfo,
    ModelInfo,
    StaticModelCatalog,
    Turn,
)
from maple_acp.store import SqliteTaskStore
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema

from .conftest import DEADLINE, connector_client

BASE = (CommandInfo(name="unlock", description="Offer more commands"),)
MORE = (*BASE, CommandInfo(name="extra", description="Only after unlock", input_hint="WHAT"))


class UnlockingEngine:
    """Offers ``/unlock``; running it offers ``/extra`` too, for this session."""

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return BASE

    async def run_turn(self, turn: Turn) -> None:
        if turn.prompt == "/unlock":
            await turn.set_commands(MORE)
        await turn.send_text("done")


@asynccontextmanager
async def host(directory: Path) -> AsyncIterator[Path]:
    """This process as the host, with the engine above, on a socket in ``directory``."""
    socket_path = directory / "run" / "acp.sock"
    store = await SqliteTaskStore.open(directory / "tasks.sqlite3")
    async with store:
        runtime = AgentService(
            store=store,
            backend=UnlockingEngine(),
            catalog=StaticModelCatalog((ModelInfo(id="m", name="M"),)),
            policy=AskForTools(frozenset()),
        )
        async with runtime:
            runtime.sign_in("test-account")
            acp = AcpService(runtime, AcpServiceConfig())
            async with trio.open_nursery() as nursery:
                await acp.start(nursery, UnixListener(socket_path))
                yield socket_path
                await HostLifecycle(runtime, acp).shutdown()
                nursery.cancel_scope.cancel()


def command_lists(client: AcpTestClient, session_id: str) -> list[list[str]]:
    return [
        [c["name"] for c in u["availableCommands"]]
        for u in client.updates(session_id)
        if u["sessionUpdate"] == "available_commands_update"
    ]


async def test_set_commands_reaches_the_client_during_the_turn(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with host(short_dir) as socket_path, connector_client(socket_path) as connector:
            client = connector.client
            await client.initialize()
            first = (await client.new_session(os.fspath(project)))["sessionId"]
            await client.wait_until(lambda: command_lists(client, first) == [["unlock"]])

            answer = await client.prompt(first, "/unlock")
            assert answer["stopReason"] == "end_turn"
            assert command_lists(client, first) == [["unlock"], ["unlock", "extra"]]
            update: dict[str, Any] = [
                u
                for u in client.updates(first)
                if u["sessionUpdate"] == "available_commands_update"
            ][-1]
            assert update["availableCommands"][1] == {
                "name": "extra",
                "description": "Only after unlock",
                "input": {"hint": "WHAT"},
            }
            # The change arrived before the turn's answer, with the turn's other updates.
            kinds = [u["sessionUpdate"] for u in client.updates(first)]
            assert kinds.index("available_commands_update", 1) < kinds.index("agent_message_chunk")

            # Another session starts from what the backend declares.
            second = (await client.new_session(os.fspath(project)))["sessionId"]
            await client.wait_until(lambda: command_lists(client, second) == [["unlock"]])
            client.validate(acp_schema)
