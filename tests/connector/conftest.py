"""Fixtures for the connector tests; the pieces themselves live in ``connector_harness``."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from connector_harness import Client, Host, connector_env


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory with a short path: AF_UNIX paths are limited to 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="macp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def host(short_dir: Path) -> Iterator[Host]:
    server = Host(short_dir / "host.sock")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def start_client() -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []

    def start(
        *args: str,
        env: Mapping[str, str] | None = None,
        stdio: str = "pipe",
        command: list[str] | None = None,
    ) -> Client:
        client = Client(
            list(args),
            env=connector_env() if env is None else env,
            stdio=stdio,
            command=command,
        )
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
