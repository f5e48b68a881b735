"""A backend's boolean option on the wire (the demo's ``brief``: echoed text cut to its first
line): offered to a v1 client that declared ``session.configOptions.boolean`` and to every v2
client, set with a boolean, refused ``-32602`` naming the option for a value of the wrong kind
(and a select given a boolean likewise), and stored with the task, so a load or resume shows it
and its turns keep it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

TWO_LINES = "first line\nsecond line"


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path, config=AcpServiceConfig(protocol_max=2)) as running:
        yield running


@asynccontextmanager
async def connected(
    harness: Harness, version: int, *, booleans: bool = True
) -> AsyncIterator[AcpTestClient]:
    async with harness.connect() as client:
        params: dict[str, Any] = {"protocolVersion": 1, "clientCapabilities": {}}
        if booleans:
            params["clientCapabilities"]["session"] = {"configOptions": {"boolean": {}}}
        if version == 2:
            params = {"protocolVersion": 2, "info": {"name": "t", "version": "0"}}
            params["capabilities"] = {}
        assert (await client.call("initialize", params))["protocolVersion"] == version
        yield client


def option(answer: dict[str, Any], option_id: str) -> dict[str, Any] | None:
    for entry in answer["configOptions"]:
        if entry.get("id", entry.get("configId")) == option_id:
            return dict(entry)
    return None


def change(sid: str, version: int, option_id: str, value: Any, kind: str | None) -> Any:
    params: dict[str, Any] = {"sessionId": sid, "configId": option_id, "value": value}
    if kind is not None:
        params["type"] = kind
    elif version == 2:
        params["type"] = "id"
    return params


async def echoed(client: AcpTestClient, sid: str, version: int, text: str) -> str:
    """What the agent answered ``text`` with, once its turn ended (a v2 prompt is answered
    when its turn starts; the turn ends with the session idle again)."""

    def idle() -> int:
        return sum(
            u["sessionUpdate"] == "state_update" and u["state"] == "idle"
            for u in client.updates(sid)
        )

    messages, idled = len(agent_messages(client, sid)), idle()
    await client.prompt(sid, text)
    if version == 2:
        with trio.fail_after(10):
            await client.wait_until(lambda: idle() > idled)
    return "".join(agent_messages(client, sid)[messages:])


def agent_messages(client: AcpTestClient, sid: str) -> list[str]:
    """The agent's messages in order, as either version's client holds them."""
    found: dict[str, str] = {}
    for update in client.updates(sid):
        if update["sessionUpdate"] == "agent_message_chunk":
            key = update.get("messageId") or str(len(found))
            found[key] = found.get(key, "") + update["content"]["text"]
    return list(found.values())


def schema(version: int, v1: AcpSchema, v2: AcpSchema) -> AcpSchema:
    return v2 if version == 2 else v1


@pytest.mark.parametrize("version", [1, 2])
async def test_brief_is_offered_set_with_a_boolean_and_cuts_the_echo(
    both: Harness,
    project: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with connected(both, version) as client:
        new = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
        sid = new["sessionId"]
        brief = option(new, "brief")
        assert brief is not None
        assert (brief["type"], brief["currentValue"], brief["name"]) == ("boolean", False, "Brief")
        assert brief["description"] == "Answer in one line"
        assert await echoed(client, sid, version, TWO_LINES) == TWO_LINES
        answer = await client.call(
            "session/set_config_option", change(sid, version, "brief", True, "boolean")
        )
        assert option(answer, "brief") == brief | {"currentValue": True}
        # The other options are as they were.
        assert option(answer, "mode") == option(new, "mode")
        assert await echoed(client, sid, version, TWO_LINES) == "first line"
        answer = await client.call(
            "session/set_config_option", change(sid, version, "brief", False, "boolean")
        )
        assert option(answer, "brief") == brief
        client.validate(schema(version, acp_schema, acp_schema_v2))


async def test_a_v1_client_that_did_not_declare_boolean_options_is_offered_none(
    both: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with connected(both, 1, booleans=False) as client:
        new = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
        assert option(new, "brief") is None
        assert [o["type"] for o in new["configOptions"]] == ["select"] * len(new["configOptions"])
        # It may still set one it knows of; the answer offers it no more than before.
        sid = new["sessionId"]
        answer = await client.call(
            "session/set_config_option", change(sid, 1, "brief", True, "boolean")
        )
        assert answer["configOptions"] == new["configOptions"]
        assert await echoed(client, sid, 1, TWO_LINES) == "first line"
        client.validate(acp_schema)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    ("option_id", "value", "kind"),
    [
        ("brief", "true", None),
        ("brief", "true", "boolean"),
        ("mode", True, "boolean"),
        ("mode", False, None),
    ],
)
async def test_a_value_of_the_wrong_kind_is_refused_naming_the_option(
    both: Harness,
    project: Path,
    version: int,
    option_id: str,
    value: Any,
    kind: str | None,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with connected(both, version) as client:
        new = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
        sid = new["sessionId"]
        with pytest.raises(ProtocolError) as caught:
            await client.call(
                "session/set_config_option", change(sid, version, option_id, value, kind)
            )
        assert caught.value.code == -32602
        assert option_id in caught.value.message
        # Nothing changed, and the session goes on.
        answer = await client.call(
            "session/set_config_option", change(sid, version, "brief", False, "boolean")
        )
        assert answer["configOptions"] == new["configOptions"]
        client.validate(schema(version, acp_schema, acp_schema_v2))


@pytest.mark.parametrize("version", [1, 2])
async def test_brief_is_stored_with_the_task_and_shown_again_on_load_or_resume(
    both: Harness,
    project: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with connected(both, version) as client:
        new = await client.call("session/new", {"cwd": str(project), "mcpServers": []})
        sid = new["sessionId"]
        await client.call(
            "session/set_config_option", change(sid, version, "brief", True, "boolean")
        )
        assert await echoed(client, sid, version, TWO_LINES) == "first line"
        await client.call("session/close", {"sessionId": sid})
    async with connected(both, version) as client:
        method = "session/resume" if version == 2 else "session/load"
        opened = await client.call(
            method, {"sessionId": sid, "cwd": str(project), "mcpServers": []}
        )
        brief = option(opened, "brief")
        assert brief is not None
        assert brief["currentValue"] is True
        assert await echoed(client, sid, version, TWO_LINES) == "first line"
        client.validate(schema(version, acp_schema, acp_schema_v2))
