"""The TypeScript SDK 2.4.0 for the interop tests whose client is a node script: installed from
the npm registry once into pytest's cache folder (kept between runs, ignored by git), the
script copied beside it (ES modules resolve packages from the script's own folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

#: The SDK whose ``/experimental/v2`` client speaks the draft this agent implements.
SDK: str = "@agentclientprotocol/sdk@2.4.0"
#: npm install finishes well within this.
INSTALL_DEADLINE_S: float = 180.0


def require_node(what: str) -> None:
    """Skip (fail on CI) when node or npm is missing."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail(f"node and npm are needed for {what}")
        pytest.skip("node and npm are not on this machine")


def sdk_script(config: pytest.Config, fallback: Path, script: Path) -> Path:
    """``script`` beside an installed SDK; runs in a thread (npm is a blocking call)."""
    cache = getattr(config, "cache", None)
    directory = Path(cache.mkdir("acp-sdk-2.4.0")) if cache is not None else fallback
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
