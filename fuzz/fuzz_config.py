"""Fuzz target: the config file, as ``maple-acp serve`` reads it.

The input is the file's bytes. They are written to a scratch file and read the way ``serve``
reads ``--config PATH``: :func:`maple_acp.config.load_config` (size bound, UTF-8, TOML, the
``serve`` keys), then, when the file has a provider section, the provider backend's
:func:`~maple_acp.backends.provider.load_provider_config`.

Invariants: the only failures are ``ConfigFileError`` and ``ProviderConfigError``, each one
line (no CR or LF: a hostile key must not forge a second line on stderr) naming the file; what
is accepted is what the documented checks promise: absolute paths, a connection limit of 1 to
8, a grace period that is a finite number of milliseconds the runtime can hold, valid relay
names, known log levels; providers with unique names, http(s) base URLs without credentials,
and a default model ``provider/model`` whose provider is configured.

Run ``python fuzz/fuzz_config.py -atheris_runs=N``; tests import :func:`fuzz_one`.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from maple_acp.backends.provider import ProviderConfigError, load_provider_config
from maple_acp.config import (
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_CONNECTIONS,
    MAX_RELAY_NAMES,
    ConfigFileError,
    load_config,
)

#: Memory-backed when the system has it: a file is written and read for every input.
_SCRATCH_DIR = tempfile.mkdtemp(
    prefix="fuzz_config_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
)
atexit.register(shutil.rmtree, _SCRATCH_DIR, ignore_errors=True)
_SCRATCH = Path(_SCRATCH_DIR) / "config.toml"
_SCRATCH.touch()
_WRITER = os.open(_SCRATCH, os.O_WRONLY)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Longest message accepted as "one line": the file name plus a list of the known keys.
_MAX_MESSAGE_CHARS = 4096


def _check_error(error: Exception) -> None:
    message = str(error)
    assert message
    assert "\n" not in message, message
    assert "\r" not in message, message
    assert len(message) <= _MAX_MESSAGE_CHARS
    assert "config" in message, message


def _check_serve(serve: dict[str, object]) -> None:
    for key in ("socket", "data_dir"):
        if key in serve:
            value = serve[key]
            assert isinstance(value, str)
            assert os.path.isabs(value)
    if "allowed_roots" in serve:
        roots = serve["allowed_roots"]
        assert isinstance(roots, tuple)
        assert all(isinstance(root, str) and os.path.isabs(root) for root in roots)
    if "max_connections" in serve:
        connections = serve["max_connections"]
        assert type(connections) is int
        assert 1 <= connections <= MAX_CONNECTIONS
    if "grace" in serve:
        grace = serve["grace"]
        assert isinstance(grace, float)
        # The runtime keeps it in integer milliseconds.
        assert grace >= 0
        assert math.isfinite(grace * 1000), f"grace {grace} has no finite milliseconds"
    if "relay_allow" in serve:
        names = serve["relay_allow"]
        assert isinstance(names, tuple)
        assert len(set(names)) <= MAX_RELAY_NAMES
        assert all(isinstance(name, str) and _ENV_NAME.match(name) for name in names)
    if "log_level" in serve:
        assert serve["log_level"] in LOG_LEVELS
    if "log_format" in serve:
        assert serve["log_format"] in LOG_FORMATS


def _check_providers(raw: dict[str, object]) -> None:
    try:
        config = load_provider_config(raw, f"config file {_SCRATCH}")
    except ProviderConfigError as error:
        _check_error(error)
        return
    names = [entry.name for entry in config.providers]
    assert names
    assert len(set(names)) == len(names)
    for entry in config.providers:
        url = urlsplit(entry.base_url)
        assert url.scheme in ("http", "https"), entry.base_url
        assert url.hostname
        assert "@" not in url.netloc, "a base URL kept credentials"
        if entry.api_key_env is not None:
            assert _ENV_NAME.match(entry.api_key_env)
        if entry.context_window is not None:
            assert type(entry.context_window) is int
            assert entry.context_window > 0
    provider, _, model = config.default_model.partition("/")
    assert provider in names
    assert model


def fuzz_one(data: bytes) -> None:
    """Check the invariants above on one file. Raises AssertionError on a violation."""
    os.ftruncate(_WRITER, 0)
    os.pwrite(_WRITER, data, 0)
    try:
        config = load_config(_SCRATCH, {})
    except ConfigFileError as error:
        _check_error(error)
        return
    assert config.path == _SCRATCH
    _check_serve(dict(config.serve))
    if config.providers:
        _check_providers(dict(config.providers))


def main() -> None:
    from _atheris import run

    modules = ["maple_acp.config", "maple_acp.backends.provider._config", __name__]
    run("fuzz_config", fuzz_one, modules)


if __name__ == "__main__":
    main()
