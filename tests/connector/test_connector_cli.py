"""Command line of the connector and the ``maple-acp`` fast path; the stdlib-only rule."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from connector_harness import TIMEOUT, Host, connector_env, run_connector

from maple_acp_connector import __version__

VERSION_LINE = f"maple-acp {__version__}\n".encode()


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_touches_no_socket(host: Host, short_dir: Path, flag: str) -> None:
    # A host is listening on the configured endpoint: --version must not connect to it ...
    result = run_connector(flag, env=connector_env(MAPLE_ACP_SOCKET=str(host.path)))
    assert (result.returncode, result.stdout, result.stderr) == (0, VERSION_LINE, b"")
    assert not host.has_pending_connection()
    # ... nor create anything where the endpoint would be.
    missing = short_dir / "no-such-dir" / "endpoint.sock"
    for args in ([flag], [flag, "--socket", str(missing)], ["--socket", str(missing), flag]):
        result = run_connector(*args, env=connector_env(MAPLE_ACP_SOCKET=str(missing)))
        assert (result.returncode, result.stdout, result.stderr) == (0, VERSION_LINE, b"")
    assert not missing.parent.exists()


def test_help_documents_usage_and_exit_status() -> None:
    result = run_connector("--help")
    assert result.returncode == 0
    assert result.stderr == b""
    text = result.stdout.decode()
    assert text.startswith("usage: maple-acp-connector [--socket PATH]\n")
    for needle in ("MAPLE_ACP_SOCKET", "MAPLE_ACP_RELAY_ENV", "exit status", "  3 "):
        assert needle in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unexpected argument '--bogus'"),
        (["--socket"], "--socket needs a PATH"),
        (["--socket="], "--socket needs a non-empty PATH"),
        (["extra"], "unexpected argument 'extra'"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = run_connector(*args)
    assert result.returncode == 2
    assert result.stdout == b""
    assert result.stderr.decode().splitlines() == [
        f"maple-acp-connector: {message}",
        "maple-acp-connector: try 'maple-acp-connector --help'",
    ]


def imported_after(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh isolated interpreter; report what it imported on top of start-up."""
    probe = textwrap.dedent(
        """
        import json, sys
        before = set(sys.modules)
        namespace = {}
        exec(compile(sys.argv[1], "<probe>", "exec"), namespace)
        new = sorted(set(sys.modules) - before)
        print(json.dumps({"new": new, "result": namespace.get("result")}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe, code],
        capture_output=True,
        timeout=TIMEOUT,
        check=True,
        env=connector_env(),
    )
    report = json.loads(result.stdout.decode().splitlines()[-1])
    assert isinstance(report, dict)
    return report


def non_stdlib(modules: list[str]) -> list[str]:
    return [
        name
        for name in modules
        if name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] != "maple_acp_connector"
    ]


def test_connector_imports_only_the_standard_library() -> None:
    report = imported_after(
        "import maple_acp_connector.__main__, maple_acp_connector._relay, "
        "maple_acp_connector._hello, maple_acp_connector.endpoint"
    )
    new = report["new"]
    assert isinstance(new, list)
    assert "maple_acp_connector._relay" in new  # the probe did load the relay
    assert non_stdlib(new) == []


def test_version_path_imports_nothing_but_the_version() -> None:
    report = imported_after(
        "import io, contextlib\n"
        "from maple_acp_connector.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    result = main(['--version'])\n"
    )
    new = report["new"]
    assert isinstance(new, list)
    ours = {name for name in new if name.startswith("maple_acp_connector")}
    assert ours == {
        "maple_acp_connector",
        "maple_acp_connector._version",
        "maple_acp_connector.__main__",
    }
    assert "socket" not in new
    assert report["result"] == 0


def test_installed_command_is_the_plain_launcher() -> None:
    # The command clients start is installed from connector/bin, not generated: a generated
    # entry point imports `re` before the connector (a third of its start-up). The import log
    # of the installed command shows what it loads.
    command = Path(sys.executable).parent / "maple-acp-connector"
    if not command.exists():
        pytest.skip("maple-acp-connector is not installed next to this interpreter")
    result = subprocess.run(
        [str(command), "--version"],
        capture_output=True,
        timeout=TIMEOUT,
        env={"PYTHONPROFILEIMPORTTIME": "1", "PATH": "/usr/bin:/bin"},
    )
    assert (result.returncode, result.stdout) == (0, VERSION_LINE)
    imported = [
        line.split("|")[-1].strip() for line in result.stderr.decode().splitlines() if "|" in line
    ]
    assert "maple_acp_connector.__main__" in imported
    assert "re" not in imported
    assert "socket" not in imported


@pytest.mark.parametrize(
    "argv", [["--version"], ["-V"], ["acp", "--version"], ["acp", "--socket", "/nonexistent/s"]]
)
def test_maple_acp_decides_acp_and_version_before_click_or_trio(argv: list[str]) -> None:
    report = imported_after(
        "import io, contextlib\n"
        "from maple_acp._main import main\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        f"    result = main({argv!r})\n"
    )
    new = report["new"]
    assert isinstance(new, list)
    assert [name for name in new if name.split(".")[0] in ("trio", "click")] == []
    assert [name for name in non_stdlib(new) if not name.startswith("maple_acp")] == []
    assert report["result"] == (1 if "--socket" in argv else 0)


def test_the_config_files_socket_is_found_after_flag_and_variable(
    host: Host, short_dir: Path
) -> None:
    """The connector reaches the host that ``serve`` and ``status`` find: the config file's
    ``socket`` when no flag or variable names one, and never over them."""
    config = short_dir / "cfg" / "maple-acp" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'socket = "{host.path}"\nlog_level = "info"\n')
    env = connector_env(XDG_CONFIG_HOME=str(short_dir / "cfg"))
    # The relay itself is tested elsewhere; here only the endpoint matters: the connector
    # connects to the file's socket, and the host then closes the connection.
    proc = subprocess.Popen(
        [sys.executable, "-I", "-m", "maple_acp_connector"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        conn = host.accept()
        conn.close()
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(timeout=TIMEOUT) in (0, 3)
    finally:
        proc.kill()
        proc.wait()
    # A variable wins over the file: the connector looks there, not at the file's socket.
    missing = short_dir / "elsewhere.sock"
    result = run_connector(env={**env, "MAPLE_ACP_SOCKET": str(missing)})
    assert result.returncode == 1
    assert str(missing).encode() in result.stderr
    assert not host.has_pending_connection()
    # A file that names no socket (or one serve would refuse) leaves the default in place.
    config.write_text("socket = 3\n")
    result = run_connector(env=env)
    assert result.returncode == 1
    assert str(host.path).encode() not in result.stderr


def test_a_plain_socket_line_is_read_without_tomllib(short_dir: Path) -> None:
    """The connector starts for every session: the usual ``socket = "PATH"`` line is read by
    hand, so ``tomllib`` (and the ``re`` and ``datetime`` it imports) stays unloaded."""
    config = short_dir / "cfg" / "maple-acp" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('data_dir = "~/d"\nsocket = "/run/x/acp.sock"   # moved\n[[providers]]\n')
    probe = (
        "import sys; from maple_acp_connector.endpoint import config_file_socket; "
        f"print(config_file_socket({{'XDG_CONFIG_HOME': {str(short_dir / 'cfg')!r}}})); "
        "print('tomllib' in sys.modules, 're' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True
    )
    assert done.stdout.split("\n")[:2] == ["/run/x/acp.sock", "False False"]
