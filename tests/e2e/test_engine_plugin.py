"""An engine kind from a package outside this repository: the test writes a tiny distribution
(a module and its ``*.dist-info`` with ``METADATA`` and ``entry_points.txt``) into a scratch
directory, puts it on ``PYTHONPATH`` and nothing else, and ``maple-acp serve`` finds its kind
through the ``maple_acp.engines`` entry points, reads its own setting, and serves a real turn
with it to a client over the socket. Nothing in ``maple_acp`` names it."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import trio

import maple_acp

from .host_processes import (
    DEADLINE,
    SERVE,
    connector_client,
    home_env,
    run_command,
    running_host,
)

PLUGIN_MODULE = "maple_echo_engine"

#: The whole engine, written only against the engine author's surface (``maple_acp.engine``).
ENGINE_SOURCE = '''
from collections.abc import Mapping
from typing import Any

from maple_acp.engine import (
    Backend,
    BuiltEngine,
    CommandInfo,
    EngineKind,
    EngineOptions,
    ProviderConfig,
    ProviderKeys,
    SettingError,
    Turn,
    TurnFailed,
    split_model_id,
)


class EchoBackend(Backend):
    """Answers each prompt with the provider's greeting, and says which model it played."""

    def __init__(self, config: ProviderConfig) -> None:
        self._config = config

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return (CommandInfo(name="echo", description="Say it back"),)

    def thought_levels(self, model_id: str | None) -> tuple[str, ...]:
        return ("quiet", "loud")

    async def warm_up(self) -> None:
        # An engine that fails to prepare: the host logs it and serves on.
        raise RuntimeError("the parrot is asleep")

    async def run_turn(self, turn: Turn) -> None:
        provider, model = split_model_id(turn.model or self._config.default_model)
        entry = self._config.provider(provider)
        if entry is None:
            raise TurnFailed("no such provider")
        text = f"{entry.kind_settings['greeting']} ({model}): {turn.prompt}"
        if turn.thought_level == "loud":
            text = text.upper()
        await turn.send_text(text)


class EchoKind(EngineKind):
    name = "echo"
    title = "Echo"

    def settings(self, extra: Mapping[str, Any]) -> dict[str, str]:
        for key in extra:
            if key != "greeting":
                raise SettingError(key, "is not an echo setting (greeting)")
        greeting = extra.get("greeting")
        if not isinstance(greeting, str) or not greeting.strip():
            raise SettingError("greeting", "must be a non-blank string")
        return {"greeting": greeting}

    def build(
        self, config: ProviderConfig, keys: ProviderKeys, options: EngineOptions
    ) -> BuiltEngine:
        return BuiltEngine(EchoBackend(config))


KIND = EchoKind()
'''


def write_plugin(root: Path) -> Path:
    """The distribution ``maple-echo-engine`` in ``root``, as pip would have installed it."""
    package = root / PLUGIN_MODULE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(ENGINE_SOURCE)
    info = root / "maple_echo_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: maple-echo-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[maple_acp.engines]\necho = {PLUGIN_MODULE}:KIND\n")
    return root


def write_config(short_dir: Path, greeting: object) -> None:
    directory = short_dir / "cfg" / "maple-acp"
    directory.mkdir(parents=True, exist_ok=True)
    shown = f'"{greeting}"' if isinstance(greeting, str) else str(greeting)
    (directory / "config.toml").write_text(
        textwrap.dedent(
            f"""\
            default_model = "parrot/polly"
            [[providers]]
            name = "parrot"
            kind = "echo"
            base_url = "http://127.0.0.1:9/v1"
            models = ["polly"]
            greeting = {shown}
            """
        )
    )


def plugin_env(short_dir: Path, plugin: Path) -> dict[str, str]:
    return home_env(
        short_dir, XDG_CONFIG_HOME=os.fspath(short_dir / "cfg"), PYTHONPATH=os.fspath(plugin)
    )


def test_the_plugin_lives_outside_the_repository(tmp_path: Path) -> None:
    checkout = Path(maple_acp.__file__).resolve().parents[1]
    plugin = write_plugin(tmp_path / "site")
    assert checkout not in plugin.resolve().parents
    assert PLUGIN_MODULE not in "".join(
        path.read_text() for path in Path(maple_acp.__file__).parent.rglob("*.py")
    )


async def test_serve_runs_a_turn_with_an_engine_kind_from_an_outside_package(
    short_dir: Path, project: Path, tmp_path: Path
) -> None:
    plugin = write_plugin(tmp_path / "site")
    write_config(short_dir, "Hello there")
    with trio.fail_after(DEADLINE):
        async with (
            running_host(
                short_dir, "--log-level", "info", env=plugin_env(short_dir, plugin)
            ) as host,
            connector_client(host.socket) as connector,
        ):
            client = connector.client
            await client.initialize()
            new = await client.new_session(os.fspath(project))
            session_id = new["sessionId"]
            answer = await client.prompt(session_id, "is anyone home?")
            assert answer["stopReason"] == "end_turn"
            assert client.text(session_id) == "Hello there (polly): is anyone home?"
            # The engine's declared members reach the client: its levels and its commands.
            [level] = [o for o in new["configOptions"] if o["id"] == "thought_level"]
            assert [v["value"] for v in level["options"]] == ["default", "quiet", "loud"]
            await client.wait_until(
                lambda: any(
                    u["sessionUpdate"] == "available_commands_update"
                    for u in client.updates(session_id)
                )
            )
            await client.call(
                "session/set_config_option",
                {"sessionId": session_id, "configId": "thought_level", "value": "loud"},
            )
            await client.prompt(session_id, "again")
            assert client.text(session_id).endswith("HELLO THERE (POLLY): AGAIN")
            status = await host.wait_status(
                lambda s: s["engine"]["providers"][0]["state"] != "checking"
            )
        assert host.process.returncode == 0
    [provider] = status["engine"]["providers"]
    assert provider["state"] == "not checked"
    assert provider["detail"] == "the echo engine does not list its models"
    assert any(
        'provider "parrot" at http://127.0.0.1:9: not checked' in line for line in host.stderr.lines
    ), host.stderr.text


def test_a_bad_setting_of_the_outside_kind_is_one_line_naming_its_key(
    short_dir: Path, tmp_path: Path
) -> None:
    plugin = write_plugin(tmp_path / "site")
    write_config(short_dir, 3)
    done = run_command(
        [*SERVE, "--socket", os.fspath(short_dir / "run" / "s.sock")],
        env=plugin_env(short_dir, plugin),
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.rstrip().endswith("providers[0].greeting: must be a non-blank string"), (
        done.stderr
    )


def test_without_the_package_the_kind_is_one_line_naming_the_installed_ones(
    short_dir: Path,
) -> None:
    write_config(short_dir, "Hello")
    done = run_command(
        [*SERVE, "--socket", os.fspath(short_dir / "run" / "s.sock")],
        env=home_env(short_dir, XDG_CONFIG_HOME=os.fspath(short_dir / "cfg")),
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert (
        "providers[0].kind: 'echo' is not an installed engine kind (installed: 'anthropic', "
        "'openai')" in done.stderr
    ), done.stderr
