"""``maple-acp doctor``: one line per check (✓, or ✗ with the fix), client settings with this
installation's absolute paths, exit 1 on any failure. Run as a subprocess against a real host,
a real data directory and a real (down) provider address."""

from __future__ import annotations

import json
import os
import socket
import sys
from functools import partial
from pathlib import Path

import trio

from .host_processes import DEADLINE, MAPLE_ACP, home_env, run_command, running_host

COMMAND = os.fspath(Path(sys.executable).parent / "maple-acp")


def _doctor(home: Path, *args: str) -> tuple[int, list[str], str]:
    env = home_env(home, XDG_CONFIG_HOME=os.fspath(home / "cfg"))
    env.pop("NO_SUCH_KEY_VARIABLE", None)
    done = run_command([*MAPLE_ACP, "doctor", *args], env=env)
    checks, _, settings = done.stdout.partition("\n\n")
    return done.returncode, checks.splitlines(), settings


async def test_a_healthy_installation_passes_every_check_and_prints_settings(
    short_dir: Path,
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            code, checks, settings = await trio.to_thread.run_sync(
                partial(
                    _doctor,
                    short_dir,
                    *("--socket", os.fspath(host.socket)),
                    *("--data-dir", os.fspath(short_dir / "data")),
                )
            )
    assert code == 0, "\n".join(checks)
    assert [line[:2] for line in checks] == ["✓ "] * len(checks)
    whats = [line[2:].partition(":")[0] for line in checks]
    assert whats == [
        "config file",
        "socket directory",
        "host",
        "data directory",
        "data directory lock",
        "store",
        "network listener",
        "engine",
        "connector",
    ]
    assert f"✓ host: answering at {host.socket}" in checks
    assert any(
        line.startswith("✓ data directory lock: held by the running host (PID ") for line in checks
    )
    zed_text = settings.split("Zed (settings.json):\n", 1)[1].split("\n\n", 1)[0]
    server = json.loads(zed_text)["agent_servers"]["Maple ACP"]
    # Not the installation's default socket: the settings name it.
    assert server == {
        "type": "custom",
        "command": COMMAND,
        "args": ["acp", "--socket", os.fspath(host.socket)],
        "env": {},
    }
    assert f"acpx --agent '{COMMAND} acp --socket {host.socket}' exec 'hello'" in settings
    assert '"command": "' + COMMAND in settings.split("JetBrains", 1)[1]


def test_a_broken_installation_says_what_to_fix_and_exits_1(short_dir: Path) -> None:
    shared = short_dir / "data"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = probe.getsockname()[1]
    config = short_dir / "cfg" / "maple-acp" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'data_dir = "{shared}"\n'
        'default_model = "away/m"\n'
        f'[[providers]]\nname = "away"\nbase_url = "http://127.0.0.1:{down}/v1"\nmodels = ["m"]\n'
    )
    code, checks, settings = _doctor(short_dir, "--socket", os.fspath(short_dir / "run" / "s.sock"))
    assert code == 1
    failed = {line[2:].partition(":")[0]: line for line in checks if line.startswith("✗ ")}
    assert set(failed) == {"host", "data directory", 'provider "away"'}
    assert failed["data directory"].endswith(f"; fix: chmod 700 {shared}")
    assert failed["host"].endswith(f"; fix: start it: {COMMAND} serve")
    assert f"127.0.0.1:{down}: unreachable" in failed['provider "away"']
    assert "; fix: " in failed['provider "away"']
    assert "Zed (settings.json):" in settings

    # A provider whose key variable is not set is one failed line naming the variable.
    config.write_text(
        'default_model = "keyed/m"\n[[providers]]\nname = "keyed"\n'
        'base_url = "http://127.0.0.1:9/v1"\napi_key_env = "NO_SUCH_KEY_VARIABLE"\n'
    )
    code, checks, _ = _doctor(short_dir)
    assert code == 1
    [line] = [line for line in checks if line.startswith("✗ providers")]
    assert "NO_SUCH_KEY_VARIABLE is not set; fix: export that variable" in line
