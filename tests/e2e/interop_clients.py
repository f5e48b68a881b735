"""Clients nobody here wrote, for the interop tests: the TypeScript SDK 2.4.0, installed from the
npm registry once into pytest's cache folder (kept between runs, ignored by git), with the
node scripts copied beside it (ES modules resolve packages from the script's own folder); and
running a client script to the one JSON line of what it saw.

The ``ts_sdk`` fixture (``conftest.py``) calls :func:`install_sdk` outside any Trio test, so a
skip shows its reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from .host_processes import MAPLE_ACP, clean_env, running_host

#: The SDK whose ``/experimental/v2`` client speaks the draft this agent implements.
SDK: str = "@agentclientprotocol/sdk@2.4.0"
#: npm install finishes well within this (it takes seconds), and within the test's hard bound.
INSTALL_DEADLINE_S: float = 120.0


def _unavailable(reason: str) -> None:
    """Skip, or fail on CI, where the interop tests must run."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def install_sdk(config: pytest.Config, fallback: Path) -> Path:
    """The folder holding the installed SDK. No node or npm, or an install that fails (no
    registry here), skips the test with the reason (npm's first line); on CI it fails it."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        _unavailable("node and npm are needed for the TypeScript interop tests")
    cache = getattr(config, "cache", None)
    directory = Path(cache.mkdir("acp-sdk-2.4.0")) if cache is not None else fallback
    if not (directory / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(directory), SDK],
                check=True,
                capture_output=True,
                timeout=INSTALL_DEADLINE_S,
            )
        except subprocess.CalledProcessError as exc:
            # npm's first line names the error (``npm error code ECONNREFUSED``).
            said = exc.stderr.decode(errors="replace").strip().splitlines()
            _unavailable(f"npm could not install {SDK}: {said[0] if said else exc}")
        except subprocess.TimeoutExpired:
            _unavailable(f"npm did not install {SDK} within {INSTALL_DEADLINE_S:.0f} s")
    return directory


def beside_sdk(sdk: Path, script: Path) -> Path:
    """``script`` copied into the SDK's folder, where its imports resolve (with the modules
    of its own folder it may import)."""
    for module in script.parent.glob("*.mjs"):
        shutil.copyfile(module, sdk / module.name)
    return sdk / script.name


async def client_report(command: Sequence[str], deadline: float) -> dict[str, Any]:
    """Run a client script to its end; the JSON line it printed last. Fails the test with
    the end of its stderr when it exits non-zero."""
    with trio.fail_after(deadline):
        result = await trio.run_process(
            list(command), capture_stdout=True, capture_stderr=True, check=False, env=clean_env()
        )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return report


async def connector_report(
    directory: Path, sdk: Path, script: Path, deadline: float
) -> tuple[dict[str, Any], Path]:
    """A node ``script`` (beside the SDK) driving ``maple-acp acp`` against a real ``maple-acp
    serve`` in ``directory``; its arguments are the connector's command, then a new project
    directory. What the script reported, and that project directory (resolved)."""
    project = directory / "project"
    project.mkdir()
    project = project.resolve()
    command = ["node", str(beside_sdk(sdk, script))]
    async with running_host(directory) as host:
        connector = [*MAPLE_ACP, "acp", "--socket", str(host.socket)]
        return await client_report([*command, *connector, str(project)], deadline), project
