"""The suite ignores the account that runs it: a hostile config file, data directory and
``MAPLE_ACP_*`` variables in the user's environment change no test's outcome."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Tests that read the default config file, data directory and endpoint (each fails when run
#: with the hostile home below and no isolation); processes are checked by the second test.
PROBES = (
    "tests/test_cli.py::test_a_shared_data_dir_is_refused_in_one_line_that_says_how_to_fix_it",
    "tests/test_cli.py::test_a_shared_socket_dir_is_refused_in_one_line_that_says_how_to_fix_it",
    "tests/test_cli.py::test_serve_refuses_a_live_endpoint_before_opening_the_store",
)
#: Bounds a hang of the inner run (it takes a few seconds).
INNER_DEADLINE_S = 120


def _hostile_home(home: Path) -> None:
    """A user's setup that would break those tests if they read it: allowed roots elsewhere,
    one connection, a provider whose key variable is not set, a shared data directory."""
    config = home / ".config" / "maple-acp"
    config.mkdir(parents=True)
    elsewhere = home / "elsewhere"
    elsewhere.mkdir()
    (config / "config.toml").write_text(
        f'allowed_roots = ["{elsewhere}"]\n'
        "max_connections = 1\n"
        'log_level = "error"\n'
        'default_model = "remote/m"\n'
        "[[providers]]\n"
        'name = "remote"\n'
        'base_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "HOSTILE_UNSET_KEY"\n'
        'models = ["m"]\n'
    )
    (home / "data").mkdir(mode=0o755)
    (home / "data").chmod(0o755)


def test_a_hostile_user_config_changes_no_test(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    _hostile_home(home)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("XDG_", "MAPLE_ACP_", "PYTEST_"))
    }
    env.update(
        HOME=os.fspath(home),
        MAPLE_ACP_SOCKET=os.fspath(home / "no-host-here.sock"),
        MAPLE_ACP_DATA_DIR=os.fspath(home / "data"),
        MAPLE_ACP_LOG_LEVEL="error",
    )
    env.pop("HOSTILE_UNSET_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *PROBES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=INNER_DEADLINE_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(PROBES)} passed" in done.stdout


def test_processes_a_test_starts_see_the_isolated_account(isolated_user: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; print(os.environ['HOME']); print(os.environ['XDG_CONFIG_HOME']);"
            "print(any(k.startswith('MAPLE_ACP_') and not k.startswith('MAPLE_ACP_LIVE_')"
            " for k in os.environ))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    home, config_home, leaked = done.stdout.split()
    assert home == os.fspath(isolated_user)
    assert config_home == os.fspath(isolated_user / ".config")
    assert leaked == "False"
