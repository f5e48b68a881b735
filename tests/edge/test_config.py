"""Service configuration validation and the persisted per-account state file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from maple_acp.edge._config import (
    AcpServiceConfig,
    ConfigError,
    PersistedServiceState,
    ServiceStateFile,
)


def test_defaults() -> None:
    config = AcpServiceConfig()
    assert config.max_connections == 8
    assert config.allowed_roots == ()
    assert config.admits("/anything/at/all")


@pytest.mark.parametrize("value", [0, 9, -1, True, "8"])
def test_max_connections_out_of_range(value: object) -> None:
    with pytest.raises(ConfigError):
        AcpServiceConfig(max_connections=value)  # type: ignore[arg-type]


def test_relative_root_refused() -> None:
    with pytest.raises(ConfigError, match="not absolute"):
        AcpServiceConfig(allowed_roots=("relative/dir",))


def test_single_string_root_refused() -> None:
    with pytest.raises(ConfigError, match="list"):
        AcpServiceConfig(allowed_roots="/tmp")


def test_roots_are_canonical_and_admit_only_below(tmp_path: Path) -> None:
    real = tmp_path / "projects"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    config = AcpServiceConfig(allowed_roots=(str(link),))
    assert config.allowed_roots == (str(real),)
    assert config.admits(str(real))
    assert config.admits(str(real / "a" / "b"))
    assert not config.admits(str(tmp_path / "projects-evil"))
    assert not config.admits(str(tmp_path))


def test_max_line_only_lower() -> None:
    AcpServiceConfig(max_line_bytes=4096)
    with pytest.raises(ConfigError):
        AcpServiceConfig(max_line_bytes=10 * 1024 * 1024 + 1)


def test_state_file_round_trip_and_modes(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    store = ServiceStateFile(directory)
    assert store.load("alice") == PersistedServiceState()
    state = PersistedServiceState(enabled=True, allowed_roots=(str(tmp_path),), max_connections=3)
    store.save("alice", state)
    assert store.load("alice") == state
    assert store.load("bob") == PersistedServiceState()
    path = store.path_for("alice")
    assert "alice" not in path.name
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert sorted(p.name for p in directory.iterdir()) == [path.name]


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b'{"version": 2}',
        b'{"version": 1, "enabled": "yes"}',
        b'{"version": 1, "maxConnections": 99}',
        b'{"version": 1, "allowedRoots": ["rel"]}',
        b"{" + b" " * 70000 + b"}",
    ],
)
def test_damaged_state_file_means_disabled(tmp_path: Path, content: bytes) -> None:
    store = ServiceStateFile(tmp_path)
    store.path_for("alice").write_bytes(content)
    assert store.load("alice").enabled is False


def test_state_dir_must_be_private(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    with pytest.raises(ConfigError, match="group or others"):
        ServiceStateFile(directory).save("alice", PersistedServiceState(enabled=True))
