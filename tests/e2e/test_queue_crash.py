"""A host killed (SIGKILL) with prompts waiting in a session's queue: after a restart the
session holds every message it admitted (the running turn's included) and none of the waiting
ones, and nothing of them runs by itself."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema

from .host_processes import DEADLINE, connector_client, running_host

QUEUE_CHANGED = "_session/queue_changed"


def waiting(client: AcpTestClient, sid: str) -> int:
    """How many prompts the latest queue notification of ``sid`` lists."""
    changes = [
        m["params"]["entries"]
        for m in client.inbound()
        if isinstance(m, dict)
        and m.get("method") == QUEUE_CHANGED
        and m["params"]["sessionId"] == sid
    ]
    return len(changes[-1]) if changes else 0


def user_texts(client: AcpTestClient, sid: str) -> list[str]:
    chunks = [u for u in client.updates(sid) if u["sessionUpdate"] == "user_message_chunk"]
    return [u["content"]["text"] for u in chunks]


async def test_a_killed_host_loses_no_admitted_message_and_replays_no_waiting_one(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    cwd = os.fspath(project)
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host, connector_client(host.socket) as connector:
            client = connector.client
            await client.initialize()
            sid = (await client.new_session(cwd))["sessionId"]
            assert (await client.prompt(sid, "/echo kept"))["stopReason"] == "end_turn"
            blocks = [{"type": "text", "text": "/echo started\n/hang"}]
            await client.send_all(
                [
                    ("session/prompt", {"sessionId": sid, "prompt": blocks}),
                    *(
                        ("session/prompt", {"sessionId": sid, "prompt": [text]})
                        for text in (
                            {"type": "text", "text": "/echo waiting one"},
                            {"type": "text", "text": "/echo waiting two"},
                        )
                    ),
                ]
            )
            # The running turn has spoken (its message is stored); two prompts wait.
            await client.wait_until(lambda: client.text(sid).endswith("started"))
            await client.wait_until(lambda: waiting(client, sid) == 2)
            client.validate(acp_schema)
            host.send_signal(signal.SIGKILL)
            await host.process.wait()
            assert host.process.returncode == -signal.SIGKILL
        async with running_host(short_dir) as host, connector_client(host.socket) as second:
            client = second.client
            await client.initialize()
            await client.load_session(sid, cwd)
            assert user_texts(client, sid) == ["/echo kept", "/echo started\n/hang"]
            # Nothing that waited runs by itself; the session takes a new prompt at once.
            assert (await client.prompt(sid, "/echo after"))["stopReason"] == "end_turn"
            assert "waiting" not in client.text(sid)
            client.validate(acp_schema)
