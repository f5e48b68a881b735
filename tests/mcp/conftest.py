"""Fixtures for the router tests: one subprocess with every loopback MCP server variant."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVERS_SCRIPT = Path(__file__).with_name("loopback_servers.py")


@pytest.fixture(scope="session")
def loopback_ports() -> Iterator[dict[str, int]]:
    """Start the loopback servers once per run; yield ``{variant: port}``."""
    process = subprocess.Popen(
        [sys.executable, str(SERVERS_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError("the loopback MCP servers did not start")
        yield json.loads(line)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def tag() -> str:
    """A value unique to one test, sent as a header so it can find its own requests."""
    return f"tag-{uuid.uuid4().hex}"
