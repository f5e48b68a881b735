"""Session modes, thinking levels, additional directories, idempotent delete and notices through
``maple-acp serve`` and a real connector process, every frame the agent sends checked against
the ACP schema (the demo backend, or the provider backend against a loopback model server)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

from .host_processes import (
    DEADLINE,
    Connector,
    answer_index,
    assert_only_protocol_lines,
    connector_client,
    home_env,
    running_host,
    updates_after,
)

BUILT_IN_MODES = ["ask", "code", "plan", "auto-edit"]
#: A client that shows notice updates says so with an empty object.
NOTICES: dict[str, Any] = {"session": {"notices": {}}}


def write_file(path: str | Path, content: str) -> str:
    return "/tool write_file " + json.dumps({"path": os.fspath(path), "content": content})


def tool_rows(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    return [u for u in client.updates(sid) if u["sessionUpdate"].startswith("tool_call")]


def option(answer: dict[str, Any], config_id: str) -> dict[str, Any] | None:
    return next((o for o in answer["configOptions"] if o["id"] == config_id), None)


def latest_answer_index(client: AcpTestClient, method: str) -> int:
    """Where the answer to the latest ``method`` request sits among the client's frames."""
    request_id = [
        m["id"]
        for m in client.outbound()
        if isinstance(m, dict) and m.get("method") == method and "id" in m
    ][-1]
    return answer_index(client, request_id)


async def refusal_code(call: Any) -> int:
    with pytest.raises(ProtocolError) as refused:
        await call
    return refused.value.code


async def mode_announced(client: AcpTestClient, sid: str, mode: str) -> None:
    await client.wait_until(
        lambda: any(
            u["sessionUpdate"] == "current_mode_update" and u["currentModeId"] == mode
            for u in client.updates(sid)
        )
    )


@asynccontextmanager
async def checked(connector: Connector, schema: AcpSchema) -> AsyncIterator[AcpTestClient]:
    """The connector's client; at the end every frame it received is checked."""
    yield connector.client
    connector.client.validate(schema)
    assert_only_protocol_lines(connector.client)


async def test_modes_are_offered_chosen_enforced_and_restored_by_a_load(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with (
            running_host(short_dir) as host,
            connector_client(host.socket) as connector,
            checked(connector, acp_schema) as client,
        ):
            await client.initialize()
            new = await client.new_session(os.fspath(project))
            sid = new["sessionId"]
            assert [m["id"] for m in new["modes"]["availableModes"]] == BUILT_IN_MODES
            assert new["modes"]["currentModeId"] == "code"
            mode_option = option(new, "mode")
            assert mode_option is not None
            assert mode_option["currentValue"] == "code"
            assert mode_option["category"] == "mode"

            # ask: a write fails its own row without asking, and the turn goes on.
            assert await client.call("session/set_mode", {"sessionId": sid, "modeId": "ask"}) == {}
            await mode_announced(client, sid, "ask")
            answer = await client.prompt(sid, write_file("ask.txt", "no"))
            assert answer["stopReason"] == "end_turn"
            assert tool_rows(client, sid)[-1]["status"] == "failed"
            assert client.permission_requests == []
            assert not (project / "ask.txt").exists()

            # auto-edit through the config option: the write runs unasked.
            chosen = await client.call(
                "session/set_config_option",
                {"sessionId": sid, "configId": "mode", "value": "auto-edit"},
            )
            assert option(chosen, "mode") == {**mode_option, "currentValue": "auto-edit"}
            await mode_announced(client, sid, "auto-edit")
            # The option's change is announced too, for clients that render config options.
            await client.wait_until(
                lambda: any(
                    u["sessionUpdate"] == "config_option_update"
                    and option(u, "mode") == {**mode_option, "currentValue": "auto-edit"}
                    for u in client.updates(sid)
                )
            )
            await client.prompt(sid, write_file("auto.txt", "yes"))
            assert tool_rows(client, sid)[-1]["status"] == "completed"
            assert (project / "auto.txt").read_text() == "yes"
            assert client.permission_requests == []

            # An unknown mode is refused either way and changes nothing.
            unknown = {"sessionId": sid, "modeId": "yolo"}
            assert await refusal_code(client.call("session/set_mode", unknown)) == -32602
            unknown_option = {"sessionId": sid, "configId": "mode", "value": "yolo"}
            assert (
                await refusal_code(client.call("session/set_config_option", unknown_option))
                == -32602
            )

            assert await client.close_session(sid) == {}
            loaded = await client.load_session(sid, os.fspath(project))
            assert loaded["modes"]["currentModeId"] == "auto-edit"
            assert [m["id"] for m in loaded["modes"]["availableModes"]] == BUILT_IN_MODES
            loaded_option = option(loaded, "mode")
            assert loaded_option is not None
            assert loaded_option["currentValue"] == "auto-edit"
            # Nothing for the session follows the load's answer: a round trip after it proves
            # whatever the attach caused had already arrived.
            loaded_at = latest_answer_index(client, "session/load")
            await client.list_sessions()
            assert updates_after(client, sid, loaded_at) == []


async def test_thought_level_is_offered_for_a_reasoning_model_and_sent_to_the_provider(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    pytest.importorskip("openai", reason="the provider backend needs the openai extra")
    from .test_cli_provider import loopback

    server = loopback.LoopbackProvider()
    server.add(loopback.text_reply("thought ", "hard"))
    config = short_dir / "cfg" / "maple-acp" / "config.toml"
    config.parent.mkdir(parents=True)
    env = home_env(short_dir, XDG_CONFIG_HOME=os.fspath(short_dir / "cfg"), LOOP_KEY="k")
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            config.write_text(
                'default_model = "loop/plain-model"\n'
                "[[providers]]\n"
                'name = "loop"\n'
                f'base_url = "http://127.0.0.1:{server.port}/v1"\n'
                'api_key_env = "LOOP_KEY"\n'
                'models = ["plain-model", { id = "think-model", reasoning = true }]\n'
            )
            async with (
                running_host(short_dir, env=env) as host,
                connector_client(host.socket) as connector,
                checked(connector, acp_schema) as client,
            ):
                await client.initialize()
                new = await client.new_session(os.fspath(project))
                sid = new["sessionId"]
                model = option(new, "model")
                assert model is not None
                assert model["currentValue"] == "loop/plain-model"
                assert option(new, "thought_level") is None
                # The plain model has no levels to choose from.
                plain_level = {"sessionId": sid, "configId": "thought_level", "value": "high"}
                assert (
                    await refusal_code(client.call("session/set_config_option", plain_level))
                    == -32602
                )

                chosen = await client.call(
                    "session/set_config_option",
                    {"sessionId": sid, "configId": "model", "value": "loop/think-model"},
                )
                levels = option(chosen, "thought_level")
                assert levels is not None
                assert levels["category"] == "thought_level"
                assert [o["value"] for o in levels["options"]] == [
                    "default",
                    "low",
                    "medium",
                    "high",
                ]

                chosen = await client.call(
                    "session/set_config_option",
                    {"sessionId": sid, "configId": "thought_level", "value": "high"},
                )
                levels = option(chosen, "thought_level")
                assert levels is not None
                assert levels["currentValue"] == "high"

                answer = await client.prompt(sid, "think about it")
                assert answer["stopReason"] == "end_turn"
                assert client.text(sid) == "thought hard"

                # The choice is stored with the session and comes back in a load's answer.
                assert await client.close_session(sid) == {}
                loaded = await client.load_session(sid, os.fspath(project))
                loaded_model = option(loaded, "model")
                assert loaded_model is not None
                assert loaded_model["currentValue"] == "loop/think-model"
                restored = option(loaded, "thought_level")
                assert restored is not None
                assert restored["currentValue"] == "high"
            nursery.cancel_scope.cancel()
    [request] = server.chat_requests()
    assert request.body["model"] == "think-model"
    assert request.body["reasoning_effort"] == "high"


async def test_additional_directories_are_advertised_writable_and_compared_on_load(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    extras = [short_dir / "extra-a", short_dir / "extra-b", short_dir / "extra-c"]
    for extra in extras:
        extra.mkdir()
    a, b, c = (os.fspath(extra) for extra in extras)
    target = extras[1] / "sub" / "there.txt"
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with (
                connector_client(host.socket) as connector,
                checked(connector, acp_schema) as client,
            ):
                init = await client.initialize()
                session_caps = init["agentCapabilities"]["sessionCapabilities"]
                assert session_caps.get("additionalDirectories") is not None
                new = await client.new_session(os.fspath(project), additionalDirectories=[a, b])
                sid = new["sessionId"]
                await client.prompt(sid, write_file(target, "beyond the cwd"))
                assert tool_rows(client, sid)[-1]["status"] == "completed"
                assert target.read_text() == "beyond the cwd"
                [request] = client.permission_requests
                assert request["toolCall"]["name"] == "write_file"
                assert await client.close_session(sid) == {}

            async with (
                connector_client(host.socket) as connector,
                checked(connector, acp_schema) as client,
            ):
                await client.initialize()
                load = {"sessionId": sid, "cwd": os.fspath(project), "mcpServers": []}
                for other in ([a], [a, c], [a, b, c]):
                    call = client.call("session/load", {**load, "additionalDirectories": other})
                    assert await refusal_code(call) == -32602, other
                # Without the field a load names no extra directories: a different set.
                assert await refusal_code(client.call("session/load", load)) == -32602
                loaded = await client.call(
                    "session/load", {**load, "additionalDirectories": [b, a]}
                )
                assert loaded["modes"]["currentModeId"] == "code"
                [listed] = (await client.list_sessions())["sessions"]
                assert sorted(listed["additionalDirectories"]) == [a, b]
                # A resume names the session's set from then on (each admitted like the cwd).
                await client.call("session/resume", {**load, "additionalDirectories": [c]})
                [listed] = (await client.list_sessions())["sessions"]
                assert listed["additionalDirectories"] == [c]


async def test_delete_answers_the_same_for_unknown_live_and_deleted_sessions(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with (
            running_host(short_dir) as host,
            connector_client(host.socket) as connector,
            checked(connector, acp_schema) as client,
        ):
            await client.initialize()
            unknown = "sess_0000000000000000000000000000"
            assert await client.delete_session(unknown) == {}
            assert await client.delete_session(unknown) == {}

            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            other = (await client.new_session(os.fspath(project)))["sessionId"]
            await client.prompt(sid, "/echo kept for a while")
            await client.prompt(other, "/echo kept")
            listed = (await client.list_sessions())["sessions"]
            assert {s["sessionId"] for s in listed} == {sid, other}

            assert await client.delete_session(sid) == {}
            assert await client.delete_session(sid) == {}
            listed = (await client.list_sessions())["sessions"]
            assert [s["sessionId"] for s in listed] == [other]
            assert await refusal_code(client.load_session(sid, os.fspath(project))) == -32002


async def test_notices_reach_only_a_client_that_opted_in(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with (
            running_host(short_dir) as host,
            connector_client(host.socket) as opted,
            connector_client(host.socket) as plain,
            checked(opted, acp_schema) as shows_notices,
            checked(plain, acp_schema) as shows_text,
        ):
            init_params = {"protocolVersion": 1, "clientCapabilities": NOTICES}
            acp_schema.validate("InitializeRequest", init_params)
            await shows_notices.call("initialize", init_params)
            await shows_text.initialize()

            sid = (await shows_notices.new_session(os.fspath(project)))["sessionId"]
            answer = await shows_notices.prompt(sid, "/nosuchdirective")
            assert answer["stopReason"] == "end_turn"
            [notice] = [u for u in shows_notices.updates(sid) if u["sessionUpdate"] == "notice"]
            assert notice["severity"] == "info"
            assert "/nosuchdirective" in notice["title"]
            assert shows_notices.text(sid) == ""

            plain_sid = (await shows_text.new_session(os.fspath(project)))["sessionId"]
            answer = await shows_text.prompt(plain_sid, "/nosuchdirective")
            assert answer["stopReason"] == "end_turn"
            kinds = {u["sessionUpdate"] for u in shows_text.updates(plain_sid)}
            assert "notice" not in kinds
            assert "/nosuchdirective" in shows_text.text(plain_sid)
