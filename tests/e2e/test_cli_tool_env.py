"""``maple-acp serve --provider-url … --api-key-env KEY``: the model's ``shell`` call running
``env`` never carries the provider's key (nor a ``MAPLE_ACP_*`` setting) to the client, the
provider or the store, through a real connector and a loopback OpenAI-compatible server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from maple_acp.testing.store import STORE_FILE_NAME

from .host_processes import DEADLINE, connector_client, running_host
from .test_cli_provider import SECRET, loopback, provider_env

pytest.importorskip("openai", reason="the provider backend needs the openai extra")

HOST_SETTING = "maple-host-setting-never-shown"


def store_bytes(data: Path) -> bytes:
    names = (STORE_FILE_NAME, f"{STORE_FILE_NAME}-wal", f"{STORE_FILE_NAME}-shm")
    return b"".join((data / name).read_bytes() for name in names if (data / name).exists())


async def test_the_models_shell_never_prints_the_provider_key(
    short_dir: Path, project: Path
) -> None:
    server = loopback.LoopbackProvider()
    server.add(
        loopback.tool_call_reply(("c1", "shell", {"command": "env"})),
        loopback.text_reply("done"),
    )
    env = provider_env(short_dir)
    env["MAPLE_ACP_SOMETHING"] = HOST_SETTING
    data = short_dir / "data"
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            args = (
                *("--provider-url", f"http://127.0.0.1:{server.port}/v1", "--model", "m"),
                *("--api-key-env", "MY_PROVIDER_KEY"),
            )
            async with (
                running_host(short_dir, *args, env=env) as host,
                connector_client(host.socket) as connector,
            ):
                client = connector.client
                await client.initialize()
                session_id = (await client.new_session(os.fspath(project)))["sessionId"]
                answer = await client.prompt(session_id, "print the environment")
                live_store = store_bytes(data)
            nursery.cancel_scope.cancel()
    assert answer["stopReason"] == "end_turn"
    frames = b"".join(frame.raw for frame in client.frames).decode()
    told = repr(server.chat_requests()[1].body["messages"])
    # The shell did run `env`, and its output reached the client, the model and the store.
    for seen in (frames, told):
        assert f"HOME={short_dir}" in seen
    assert f"HOME={short_dir}".encode() in live_store
    for secret in (SECRET, HOST_SETTING):
        assert secret not in frames
        assert secret not in told
        assert secret.encode() not in live_store
        assert secret.encode() not in store_bytes(data)
    assert "MY_PROVIDER_KEY" not in frames
    assert "MAPLE_ACP_SOMETHING" not in frames
