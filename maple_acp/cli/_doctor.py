"""``maple-acp doctor``: check this installation the way a new user's first hour goes wrong,
one line per check, and print client settings ready to paste.

The checks, in order: the config file; the endpoint's directory and whether a host answers
there; the data directory (private, its lock, the store's integrity); each configured provider
(its key variable, then ``GET /models`` within 5 s); the connector command. A failed check says
how to fix it on the same line. Nothing is created or repaired: a missing directory is one that
``serve`` will create.

Resource handling: the store is opened read-only for its integrity check and closed again; the
data directory's lock is taken only to see whether it is free and released at once (never
while a host holds it: the attempt fails without waiting).

Error handling: every failure becomes a failed check; nothing propagates but interrupts.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from maple_acp.cli._client import HostUnavailable, host_status
from maple_acp.cli._engine import provider_engine
from maple_acp.cli._errors import CliError
from maple_acp.cli._host import STORE_FILE_NAME
from maple_acp.config import (
    ConfigFile,
    ConfigFileError,
    SettingError,
    default_config_file,
    load_config,
    resolve_serve_settings,
    resolve_socket,
)
from maple_acp.store import DataDirectoryLocked, StoreError, check_data_directory_free
from maple_acp_connector.endpoint import UnsafeDirectory, check_private_dir, resolve_endpoint

#: The connector answering ``--version`` takes well under a second; more is a broken install.
CONNECTOR_CHECK_TIMEOUT_S: Final = 10.0
#: ``status`` over the socket: a local host answers at once.
HOST_CHECK_TIMEOUT_S: Final = 5.0
OK: Final = "✓"
FAILED: Final = "✗"


@attrs.frozen
class Check:
    ok: bool
    what: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        if self.ok:
            return f"{OK} {self.what}: {self.detail}"
        return f"{FAILED} {self.what}: {self.detail}; fix: {self.fix}"


@attrs.frozen(kw_only=True)
class DoctorInputs:
    """What ``doctor`` was pointed at (the same flags ``serve`` takes, all optional)."""

    config_path: Path | None = None
    socket_path: str | None = None
    data_dir: Path | None = None


def maple_acp_command() -> Path:
    """This installation's ``maple-acp`` script: beside the interpreter (a venv's ``bin``)."""
    beside = Path(sys.executable).parent / "maple-acp"
    if beside.exists():
        return beside.absolute()
    return Path(os.path.abspath(sys.argv[0]))


def _config_check(inputs: DoctorInputs, env: Mapping[str, str]) -> tuple[Check, ConfigFile]:
    path = inputs.config_path or default_config_file(env)
    try:
        config = load_config(inputs.config_path, env)
    except ConfigFileError as exc:
        return Check(False, "config file", str(exc), f"edit or remove {path}"), ConfigFile()
    if config.path is None:
        return Check(True, "config file", f"none at {path}; the defaults apply"), config
    keys = len(config.serve) + len(config.providers)
    return Check(True, "config file", f"{config.path} read ({keys} settings)"), config


def _directory_state(path: Path) -> tuple[bool, str, str]:
    """(ok, what is there, fix) for a directory that must be private."""
    try:
        check_private_dir(path)
    except FileNotFoundError:
        return True, f"{path} does not exist yet; serve creates it 0700", ""
    except UnsafeDirectory as exc:
        if exc.path == os.fspath(path):
            try:
                mode = stat.S_IMODE(os.lstat(path).st_mode)
            except OSError:
                mode = None
            if mode is not None and mode & 0o077:
                return False, f"{path}: {exc.reason}", f"chmod 700 {path}"
        return False, f"{exc.path}: {exc.reason}", "choose a private directory you own"
    return True, f"{path} is private (0700)", ""


def _endpoint_checks(
    inputs: DoctorInputs, env: Mapping[str, str], config: ConfigFile
) -> tuple[list[Check], Path, dict[str, Any] | None]:
    chosen = resolve_socket(inputs.socket_path, env, config)
    endpoint = resolve_endpoint(chosen, env)
    ok, state, fix = _directory_state(endpoint.parent)
    checks = [Check(ok, "socket directory", state, fix)]
    status: dict[str, Any] | None = None
    try:
        status = host_status(endpoint, timeout=HOST_CHECK_TIMEOUT_S, max_bytes=64 * 1024)
    except HostUnavailable as exc:
        checks.append(Check(False, "host", str(exc), f"start it: {maple_acp_command()} serve"))
    else:
        checks.append(Check(True, "host", f"answering at {endpoint}"))
    return checks, endpoint, status


def _data_checks(
    inputs: DoctorInputs, env: Mapping[str, str], config: ConfigFile, host_running: bool
) -> list[Check]:
    try:
        flags = {"data_dir": os.path.abspath(inputs.data_dir) if inputs.data_dir else None}
        data_dir = resolve_serve_settings(flags, env, config).data_dir
    except SettingError as exc:
        return [Check(False, "data directory", str(exc), "fix the variable or unset it")]
    ok, state, fix = _directory_state(data_dir)
    checks = [Check(ok, "data directory", state, fix)]
    store = data_dir / STORE_FILE_NAME
    if not ok or not store.exists():
        if ok:
            checks.append(Check(True, "store", f"{store} does not exist yet; serve creates it"))
        return checks
    try:
        check_data_directory_free(os.fspath(store))
    except DataDirectoryLocked as exc:
        holder = f"PID {exc.holder_pid}" if exc.holder_pid else "an unknown process"
        if host_running:
            checks.append(
                Check(True, "data directory lock", f"held by the running host ({holder})")
            )
        else:
            checks.append(
                Check(
                    False,
                    "data directory lock",
                    f"held by {holder}, but no host answers on the endpoint",
                    "stop that process, or give serve another --data-dir",
                )
            )
    except StoreError as exc:
        checks.append(Check(False, "data directory lock", str(exc), "check the directory's owner"))
    else:
        checks.append(Check(True, "data directory lock", "free (no host is using it)"))
    checks.append(_integrity_check(store))
    return checks


def _network_check(
    inputs: DoctorInputs, env: Mapping[str, str], config: ConfigFile, status: Any
) -> Check:
    """The network listener: serving (the running host's URL), configured, or off. Never the
    token, only where it is and whether its file is private."""
    engine = status.get("engine") if isinstance(status, dict) else None
    if isinstance(engine, dict) and isinstance(engine.get("http"), str):
        return Check(True, "network listener", f"serving at {engine['http']}")
    try:
        flags = {"data_dir": os.path.abspath(inputs.data_dir) if inputs.data_dir else None}
        settings = resolve_serve_settings(flags, env, config)
    except SettingError as exc:
        return Check(False, "network listener", str(exc), "fix the variable or unset it")
    if settings.http_listen is None:
        return Check(True, "network listener", "off (serve --http HOST:PORT turns it on)")
    from maple_acp.net import INSTALL_HINT, origin_problem, token_path

    if importlib.util.find_spec("hypercorn") is None:
        return Check(False, "network listener", "hypercorn is not installed", INSTALL_HINT)
    for entry in settings.http_allowed_origins:
        problem = origin_problem(entry)
        if problem is not None:
            fix = (
                "write it as a browser sends it, e.g. https://ide.example or http://localhost:3000"
            )
            return Check(False, "network listener", problem, fix)
    token = token_path(settings.data_dir)
    if token.exists() and token.stat().st_mode & 0o077:
        return Check(
            False, "network listener", f"the token file {token} is readable by others",
            f"chmod 600 {token}",
        )  # fmt: skip
    made = "exists" if token.exists() else "is created on first use"
    return Check(
        True,
        "network listener",
        f"configured at {settings.http_listen}; the token file {token} {made}",
    )


def _integrity_check(store: Path) -> Check:
    try:
        conn = sqlite3.connect(f"{store.absolute().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return Check(False, "store", f"{store} cannot be read ({exc})", "restore it from a backup")
    if rows != [("ok",)]:
        first = str(rows[0][0]) if rows else "no answer"
        return Check(False, "store", f"{store} is damaged ({first})", "restore it from a backup")
    return Check(True, "store", f"{store} passes SQLite's integrity check")


def _provider_checks(config: ConfigFile) -> list[Check]:
    """Each provider's check, on the engine ``serve`` would build from ``config``."""
    try:
        engine = provider_engine(
            config, None, None, None, tuple(config.serve.get("tool_env_allow", ()))
        )
    except CliError as exc:
        fix = (
            "export that variable where serve starts, or change the setting"
            if exc.message.endswith("is not set")
            else "fix the provider setting named"
        )
        return [Check(False, "providers", exc.message, fix)]
    if engine is None:
        return [Check(True, "engine", "the demo backend (no provider configured)")]
    import trio

    _, catalog, _ = engine()
    results = trio.run(catalog.check_providers)
    return [
        Check(
            result.ok,
            f'provider "{result.name}"',
            f"{result.address}: {result.state}"
            + (
                f", {result.models} model{'' if result.models == 1 else 's'} listed"
                if result.models is not None
                else ""
            ),
            result.detail or "check the provider",
        )
        for result in results
    ]


def _connector_check() -> Check:
    command = maple_acp_command()
    if not os.access(command, os.X_OK):
        return Check(
            False, "connector", f"{command} is not executable", "reinstall: pip install -e ."
        )
    try:
        done = subprocess.run(
            [os.fspath(command), "acp", "--version"],
            capture_output=True,
            text=True,
            timeout=CONNECTOR_CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(False, "connector", f"{command} acp did not run ({exc})", "reinstall it")
    if done.returncode != 0:
        return Check(
            False, "connector", f"{command} acp --version exited {done.returncode}", "reinstall it"
        )
    return Check(True, "connector", f"{command} acp runs ({done.stdout.strip()})")


def run_checks(inputs: DoctorInputs, env: Mapping[str, str]) -> tuple[list[Check], Path]:
    """Every check in order, and the endpoint the client settings must reach."""
    config_check, config = _config_check(inputs, env)
    checks = [config_check]
    endpoint_checks, endpoint, status = _endpoint_checks(inputs, env, config)
    checks += endpoint_checks
    checks += _data_checks(inputs, env, config, host_running=status is not None)
    checks.append(_network_check(inputs, env, config, status))
    if config_check.ok:
        checks += _provider_checks(config)
    checks.append(_connector_check())
    return checks, endpoint


def client_settings(command: Path, endpoint: Path, default_endpoint: Path) -> Iterator[str]:
    """Zed, JetBrains and acpx settings with this installation's absolute paths; the socket
    is named only when it is not the installation's default."""
    import json

    args = ["acp"] if endpoint == default_endpoint else ["acp", "--socket", os.fspath(endpoint)]
    zed = {
        "agent_servers": {
            "Maple ACP": {"type": "custom", "command": os.fspath(command), "args": args, "env": {}}
        }
    }
    jetbrains = {"agent_servers": {"Maple ACP": {"command": os.fspath(command), "args": args}}}
    shell = " ".join([os.fspath(command), *args])
    yield "Zed (settings.json):"
    yield json.dumps(zed, indent=2)
    yield ""
    yield "JetBrains AI Assistant (~/.jetbrains/acp.json):"
    yield json.dumps(jetbrains, indent=2)
    yield ""
    yield "acpx:"
    yield f"acpx --agent '{shell}' exec 'hello'"
