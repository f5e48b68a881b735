"""A config path that is not a regular file (a FIFO, a directory, a device) is refused in one
line at once: ``serve`` never waits on a FIFO for a writer that does not come."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from e2e.host_processes import home_env

from maple_acp.config import ConfigFileError, load_config

MAIN = [sys.executable, "-m", "maple_acp._main"]
#: Far above a refusal's start-up time (well under a second): only a hang reaches it.
REFUSAL_TIMEOUT_S = 20.0


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    os.mkfifo(path)
    return path


@contextmanager
def unblocked(fifo: Path) -> Iterator[None]:
    """While the block runs, ``fifo`` is opened for writing (then closed) every
    ``REFUSAL_TIMEOUT_S``: a reader blocked in ``open`` then reads an empty file, so that a
    regression fails the test instead of hanging it."""
    done = threading.Event()

    def unblock() -> None:
        while not done.wait(REFUSAL_TIMEOUT_S):
            with suppress(OSError):  # no reader yet
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_a_fifo_as_the_config_file_is_refused_without_blocking(fifo: Path) -> None:
    with unblocked(fifo), pytest.raises(ConfigFileError) as caught:
        load_config(fifo, {})
    assert str(caught.value) == f"config file {fifo}: a FIFO, not a regular file"


def test_a_fifo_at_the_default_config_path_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "maple-acp").mkdir()
    fifo = tmp_path / "maple-acp" / "config.toml"
    os.mkfifo(fifo)
    with unblocked(fifo), pytest.raises(ConfigFileError, match="a FIFO, not a regular file"):
        load_config(None, {"XDG_CONFIG_HOME": os.fspath(tmp_path)})


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("directory", "a directory, not a regular file"),
        ("/dev/null", "a device, not a regular file"),
    ],
)
def test_a_directory_or_a_device_as_the_config_file_is_refused(
    tmp_path: Path, target: str, problem: str
) -> None:
    path = tmp_path if target == "directory" else Path(target)
    with pytest.raises(ConfigFileError) as caught:
        load_config(path, {})
    assert str(caught.value) == f"config file {path}: {problem}"


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_serve_with_a_config_that_is_not_a_regular_file_exits_1_at_once(
    tmp_path: Path, fifo: Path, kind: str
) -> None:
    path = {"fifo": fifo, "directory": tmp_path / "dir", "device": Path("/dev/null")}[kind]
    if kind == "directory":
        path.mkdir()
    done = subprocess.run(
        [*MAIN, "serve", "--config", os.fspath(path), "--socket", os.fspath(tmp_path / "s.sock")],
        capture_output=True,
        text=True,
        check=False,
        timeout=REFUSAL_TIMEOUT_S,
        env=home_env(tmp_path),
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"maple-acp: config file {path}: ")
    assert done.stderr.endswith(", not a regular file\n")
    assert not (tmp_path / "s.sock").exists()
