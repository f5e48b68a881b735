"""``maple-acp serve`` with a real model provider: the one-line flags and ``[[providers]]`` in
the config file, against a loopback OpenAI-compatible server, through a real connector."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from maple_acp.cli import format_status

from .host_processes import (
    DEADLINE,
    MAPLE_ACP,
    SERVE,
    connector_client,
    home_env,
    run_command,
    running_host,
)

pytest.importorskip("openai", reason="the provider backend needs the openai extra")


def _loopback() -> ModuleType:
    """The provider tests' scripted OpenAI-compatible server (a file, not a package)."""
    path = Path(__file__).resolve().parents[1] / "backends" / "openai" / "loopback.py"
    spec = importlib.util.spec_from_file_location("provider_loopback", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


loopback = _loopback()
SECRET = "sk-test-4bd1c0ffee-never-printed"


def provider_env(short_dir: Path) -> dict[str, str]:
    return home_env(short_dir, XDG_CONFIG_HOME=os.fspath(short_dir / "cfg"), MY_PROVIDER_KEY=SECRET)


async def chat_through_serve(
    short_dir: Path, project: Path, setup: Callable[[int], list[str]], server: Any
) -> tuple[dict[str, Any], str, list[str]]:
    """Start the loopback ``server``, then ``serve`` with ``setup(port)``'s arguments, and run
    one prompt through a real connector."""
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        args = [*setup(server.port), "--log-level", "debug"]
        async with (
            running_host(short_dir, *args, env=provider_env(short_dir)) as host,
            connector_client(host.socket) as connector,
        ):
            client = connector.client
            await client.initialize()
            new = await client.new_session(os.fspath(project))
            session_id = new["sessionId"]
            answer = await client.prompt(session_id, "say hello")
            text = client.text(session_id)
        assert host.process.returncode == 0
        nursery.cancel_scope.cancel()
    return {"new": new, "answer": answer}, text, host.stderr.lines


async def test_provider_flags_make_serve_a_real_agent(short_dir: Path, project: Path) -> None:
    server = loopback.LoopbackProvider()
    server.add(loopback.text_reply("hello ", "from the model"))

    def flags(port: int) -> list[str]:
        return [
            *("--provider-url", f"http://127.0.0.1:{port}/v1", "--model", "test-model"),
            *("--api-key-env", "MY_PROVIDER_KEY"),
        ]

    with trio.fail_after(DEADLINE):
        result, text, stderr = await chat_through_serve(short_dir, project, flags, server)
    assert result["answer"]["stopReason"] == "end_turn"
    assert text == "hello from the model"
    models = [o for o in result["new"]["configOptions"] if o["id"] == "model"]
    assert models[0]["currentValue"] == "provider/test-model"
    request = server.chat_requests()[0]
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert request.body["model"] == "test-model"
    assert not any(SECRET in line for line in stderr)


async def test_providers_from_the_config_file(short_dir: Path, project: Path) -> None:
    server = loopback.LoopbackProvider()
    server.add(loopback.text_reply("configured"))
    (short_dir / "cfg" / "maple-acp").mkdir(parents=True)
    config = short_dir / "cfg" / "maple-acp" / "config.toml"

    def write_config(port: int) -> list[str]:
        config.write_text(
            'default_model = "local/m1"\n'
            'system_prompt = "Answer briefly."\n'
            "[[providers]]\n"
            'name = "local"\n'
            f'base_url = "http://127.0.0.1:{port}/v1"\n'
            'api_key_env = "MY_PROVIDER_KEY"\n'
            'models = ["m1", "m2"]\n'
        )
        return []

    with trio.fail_after(DEADLINE):
        result, text, _ = await chat_through_serve(short_dir, project, write_config, server)
    assert text == "configured"
    models = next(o for o in result["new"]["configOptions"] if o["id"] == "model")
    assert models["currentValue"] == "local/m1"
    assert [o["value"] for o in models["options"]] == ["local/m1", "local/m2"]
    messages = server.chat_requests()[0].body["messages"]
    assert messages[0] == {"role": "system", "content": "Answer briefly."}


@pytest.mark.parametrize(
    ("config", "args", "expected"),
    [
        (
            'default_model = "x/m"\n[[providers]]\nname = "x"\n'
            'base_url = "http://127.0.0.1:9/v1"\napi_key_env = "UNSET_KEY_VARIABLE"\n',
            [],
            "api_key_env: the environment variable UNSET_KEY_VARIABLE is not set",
        ),
        ("[[providers]]\nname = 3\n", [], "providers[0].name"),
        (
            "",
            ["--provider-url", "http://127.0.0.1:9/v1", "--model", "m", "--api-key-env", "NOPE"],
            "--api-key-env: the environment variable NOPE is not set",
        ),
    ],
)
def test_a_bad_provider_setting_is_one_line(
    short_dir: Path, config: str, args: list[str], expected: str
) -> None:
    (short_dir / "cfg" / "maple-acp").mkdir(parents=True)
    (short_dir / "cfg" / "maple-acp" / "config.toml").write_text(config)
    done = run_command(
        [*SERVE, "--socket", os.fspath(short_dir / "run" / "s.sock"), *args],
        env=provider_env(short_dir),
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("maple-acp: ")
    assert expected in done.stderr
    assert not (short_dir / "run").exists()


async def test_serve_checks_each_provider_at_start_and_status_shows_them(
    short_dir: Path, project: Path
) -> None:
    """A provider refusing a missing key and one that is down: ``serve`` starts anyway, logs
    one line for each with the fix, and ``status`` shows the backend, each state and the
    default model."""
    server = loopback.LoopbackProvider()
    server.models = loopback.error_reply(401, "missing bearer")
    (short_dir / "cfg" / "maple-acp").mkdir(parents=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = probe.getsockname()[1]
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            (short_dir / "cfg" / "maple-acp" / "config.toml").write_text(
                'default_model = "keyless/m1"\n'
                f'[[providers]]\nname = "keyless"\nbase_url = "{server.base_url}"\n'
                'models = ["m1"]\n'
                f'[[providers]]\nname = "away"\nbase_url = "http://127.0.0.1:{down}/v1"\n'
                'models = ["m2"]\n'
            )
            async with running_host(short_dir, env=provider_env(short_dir)) as host:
                lines = [
                    await host.stderr.wait_for(lambda line, n=name: f'provider "{n}" at' in line)
                    for name in ("keyless", "away")
                ]
                done = await trio.to_thread.run_sync(
                    partial(
                        run_command,
                        [*MAPLE_ACP, "status", "--socket", os.fspath(host.socket), "--json"],
                        env=provider_env(short_dir),
                    )
                )
            nursery.cancel_scope.cancel()
    # The HTTP library's own INFO line per request is detail: shown only at debug.
    assert not [line for line in host.stderr.lines if "HTTP Request" in line]
    assert "INFO" in lines[0]
    assert lines[0].endswith(
        f'provider "keyless" at http://127.0.0.1:{server.port}: unauthorized (HTTP 401: no key '
        "variable is configured: set --api-key-env NAME, or api_key_env in the file)"
    )
    assert f'provider "away" at http://127.0.0.1:{down}: unreachable (' in lines[1]
    assert done.returncode == 0, done.stderr
    engine = json.loads(done.stdout)["engine"]
    assert engine["backend"] == "provider"
    assert engine["defaultModel"] == "keyless/m1"
    assert [(p["name"], p["state"]) for p in engine["providers"]] == [
        ("keyless", "unauthorized"),
        ("away", "unreachable"),
    ]
    text = format_status(json.loads(done.stdout))
    assert "  backend:      provider" in text
    assert "  model:        keyless/m1 (the default)" in text
    assert f"  provider:     away at http://127.0.0.1:{down}: unreachable" in text
