"""The TypeScript ACP SDK for the interop tests: node and npm required (skipped without them,
failed under CI), the SDK installed from the npm registry once into pytest's cache folder, and
a client script placed beside it (ES modules resolve packages from the script's own folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

#: The SDK the interop clients are written against.
SDK = "@agentclientprotocol/sdk@2.4.0"
#: npm install finishes well within this.
INSTALL_DEADLINE_S = 180.0


def require_node(what: str) -> None:
    """Skip the test without node and npm (fail it under CI); ``what`` names the test."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail(f"node and npm are needed for {what}")
        pytest.skip("node and npm are not on this machine")


def _install(directory: Path, script: Path) -> Path:
    if not (directory / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(directory), SDK],
            check=True,
            capture_output=True,
            timeout=INSTALL_DEADLINE_S,
        )
    shutil.copyfile(script, directory / script.name)
    return directory / script.name


async def sdk_script(config: pytest.Config, fallback: Path, script: Path) -> Path:
    """``script`` beside the installed SDK: in pytest's own cache folder (kept between runs,
    ignored by git), else in ``fallback``."""
    cache = getattr(config, "cache", None)
    directory = Path(cache.mkdir("acp-sdk-2.4.0")) if cache is not None else fallback
    return await trio.to_thread.run_sync(_install, directory, script)
