"""The TypeScript SDK 2.4.0 for the interop tests whose client is a node script: installed from
the npm registry once into pytest's cache folder (kept between runs, ignored by git), each
script copied beside it (ES modules resolve packages from the script's own folder).

The ``ts_sdk`` fixture (``conftest.py``) calls :func:`install_sdk` outside any Trio test, so a
skip shows its reason."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

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
    """``script`` copied into the SDK's folder, where its imports resolve."""
    shutil.copyfile(script, sdk / script.name)
    return sdk / script.name
