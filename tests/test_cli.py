"""The ``maple-acp`` command line's refusals and defaults, without a running host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from e2e.host_processes import home_env

from maple_acp.cli import _client as _cli_client
from maple_acp.cli import cli, format_status
from maple_acp.cli._client import (
    AcpCallError,
    HostUnavailable,
    LineClient,
    printable,
    render_transcript,
)

MAIN = [sys.executable, "-m", "maple_acp._main"]


def run_main(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MAIN, *args], capture_output=True, text=True, check=False, env=env, timeout=60
    )


def test_a_shared_data_dir_is_refused_in_one_line_that_says_how_to_fix_it(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    result = CliRunner().invoke(
        cli, ["serve", "--socket", str(tmp_path / "s.sock"), "--data-dir", str(shared)]
    )
    assert result.exit_code == 1
    assert result.output == (
        f"maple-acp: cannot use the data directory {shared}: its mode 0755 grants access to "
        f"group or others; make it private with: chmod 700 {shared}\n"
    )
    assert "socket directory" not in result.output
    assert not (shared / "tasks.sqlite3").exists()


def test_a_shared_socket_dir_is_refused_in_one_line_that_says_how_to_fix_it(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "run"
    shared.mkdir()
    shared.chmod(0o755)
    result = CliRunner().invoke(
        cli, ["serve", "--socket", str(shared / "acp.sock"), "--data-dir", str(tmp_path / "d")]
    )
    assert result.exit_code == 1
    assert result.output == (
        f"maple-acp: cannot use the socket directory {shared}: its mode 0755 grants access to "
        f"group or others; make it private with: chmod 700 {shared}\n"
    )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("root", ["relative/dir", "/definitely/not/here"])
def test_serve_refuses_a_bad_allowed_root(tmp_path: Path, root: str) -> None:
    result = CliRunner().invoke(
        cli,
        [
            *("serve", "--socket", str(tmp_path / "s.sock")),
            *("--data-dir", str(tmp_path / "d"), "--allowed-root", root),
        ],
    )
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "--allowed-root" in result.output


def test_serve_refuses_a_live_endpoint_before_opening_the_store(tmp_path: Path) -> None:
    path = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        result = CliRunner().invoke(
            cli, ["serve", "--socket", str(path), "--data-dir", str(tmp_path / "d")]
        )
    assert result.exit_code == 1
    assert result.output == f"maple-acp: another service is already listening at {path}\n"
    assert not (tmp_path / "d").exists()


def test_status_refuses_an_endpoint_that_is_not_a_socket(tmp_path: Path) -> None:
    impostor = tmp_path / "impostor.sock"
    impostor.write_text("")
    result = CliRunner().invoke(cli, ["status", "--socket", str(impostor)])
    assert result.exit_code == 1
    assert "not a socket" in result.output


def test_status_reports_a_peer_that_closes_without_answering(tmp_path: Path) -> None:
    path = tmp_path / "mute.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(1)

        def close_at_accept() -> None:
            # What a host at its connection limit does.
            conn, _ = listener.accept()
            conn.close()

        closer = threading.Thread(target=close_at_accept)
        closer.start()
        result = CliRunner().invoke(cli, ["status", "--socket", str(path)])
        closer.join()
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "closed the connection without answering" in result.output


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":1,"result":[1,2]}\n', "did not return a status"),
        (
            b'{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}\n',
            "refused the status query",
        ),
        (b'{"jsonrpc":"2.0","id":1,"result":{"x":"' + b"y" * 70_000 + b'"}}\n', "a line over"),
        (b"not json\n", "not JSON"),
    ],
)
def test_status_reports_a_peer_that_answers_badly_in_one_line(
    tmp_path: Path, reply: bytes, expected: str
) -> None:
    path = tmp_path / "odd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(1)

        def answer_oddly() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(reply)

        peer = threading.Thread(target=answer_oddly)
        peer.start()
        result = CliRunner().invoke(cli, ["status", "--socket", str(path)])
        peer.join()
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert expected in result.output


def test_status_summary_names_every_counter() -> None:
    text = format_status(
        {
            "endpoint": "/run/x.sock",
            "signedIn": True,
            "connections": 3,
            "sessions": 2,
            "activeRuns": 1,
            "leases": 2,
        }
    )
    assert "/run/x.sock" in text
    assert "connections:  3" in text
    assert "sessions:     2" in text
    assert "active runs:  1" in text
    assert "leases:       2 (sessions a client holds open)" in text


def test_version_from_click_matches_the_fast_path() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("maple-acp ")


@pytest.mark.parametrize("name", ["A-B", "", "1ABC", "X=Y"])
def test_serve_refuses_a_relay_name_that_is_not_an_environment_name(
    tmp_path: Path, name: str
) -> None:
    result = CliRunner().invoke(
        cli, ["serve", "--socket", str(tmp_path / "s.sock"), "--relay-allow", name]
    )
    assert result.exit_code == 2
    assert "is not an environment variable name" in result.output


def test_package_import_is_cheap_and_exports_resolve() -> None:
    """`import maple_acp` must not load trio (the entry point and host UIs import it)."""
    code = (
        "import sys, maple_acp; assert 'trio' not in sys.modules, 'trio loaded'; "
        "names = [getattr(maple_acp, n) for n in maple_acp.__all__]; print(len(names))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(__import__("maple_acp").__all__)


def test_help_lists_every_command_acp_included_and_h_works_everywhere() -> None:
    top = run_main("--help")
    assert top.returncode == 0
    for name in ("acp", "serve", "status", "sessions", "demo"):
        assert f"\n  {name} " in top.stdout, top.stdout
    assert run_main("-h").stdout == top.stdout
    for command in (
        ["serve"],
        ["status"],
        ["demo"],
        ["sessions"],
        ["sessions", "list"],
        ["sessions", "show"],
        ["sessions", "delete"],
        ["acp"],
    ):
        done = run_main(*command, "-h")
        assert done.returncode == 0, (command, done.stderr)
        assert "usage" in done.stdout.lower(), command


def test_version_takes_no_arguments() -> None:
    for flag in ("--version", "-V"):
        ok = run_main(flag)
        assert (ok.returncode, ok.stdout) == (0, ok.stdout)
        assert ok.stdout.startswith("maple-acp ")
        bad = run_main(flag, "extra")
        assert bad.returncode == 2
        assert bad.stdout == ""
        assert "takes no arguments" in bad.stderr
        assert "'extra'" in bad.stderr


def test_version_and_acp_stay_off_click_and_trio() -> None:
    code = (
        "import sys; from maple_acp._main import main; main(['--version']);"
        "assert 'click' not in sys.modules and 'trio' not in sys.modules, 'slow path'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_serve_help_shows_the_real_defaults_with_their_fallbacks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = run_main("serve", "--help", env=home_env(home))
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    # click wraps long lines anywhere in a path: compare the paths without any whitespace.
    dense = "".join(done.stdout.split())
    assert "$XDG_DATA_HOME/maple-acp,else~/.local/share/maple-acp" in dense
    assert f"here:{home}/.local/share/maple-acp]" in dense
    assert "$MAPLE_ACP_DATA_DIR" in text
    assert "$MAPLE_ACP_LOG_LEVEL" in text
    assert "[default: 8]" in text
    assert "[default: 600]" in text
    assert "[default: info]" in text
    with_xdg = run_main("serve", "--help", env=home_env(home, XDG_DATA_HOME=str(tmp_path / "x")))
    assert f"here:{tmp_path}/x/maple-acp]" in "".join(with_xdg.stdout.split())


def test_status_json_without_a_host_is_still_one_json_object(tmp_path: Path) -> None:
    path = tmp_path / "nobody.sock"
    done = run_main("status", "--json", "--socket", str(path), env=home_env(tmp_path))
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["running"] is False
    assert report["endpoint"] == str(path)
    assert "no socket there" in report["reason"]


@pytest.mark.parametrize(
    "command", [["sessions", "list"], ["sessions", "show", "abc"], ["sessions", "delete", "abc"]]
)
def test_sessions_without_a_host_is_one_line_and_exit_1(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "nobody.sock"
    done = run_main(*command, "--socket", str(path), env=home_env(tmp_path))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"maple-acp: the maple-acp service is unavailable at {path}: "
        "no socket there (is the host running?)\n"
    )


def test_a_bad_config_file_stops_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("max_connections = 99\n")
    done = run_main("serve", "--config", str(config), env=home_env(tmp_path))
    assert done.returncode == 1
    assert done.stderr == (
        f"maple-acp: config file {config}: max_connections: must be an integer from 1 to 8, "
        "not 99\n"
    )
    # The default file is read too, from $XDG_CONFIG_HOME.
    (tmp_path / "cfg" / "maple-acp").mkdir(parents=True)
    (tmp_path / "cfg" / "maple-acp" / "config.toml").write_text("colour = 'blue'\n")
    done = run_main("serve", env=home_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "cfg")))
    assert done.returncode == 1
    assert "config.toml: colour: unknown key" in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_bad_log_level_in_the_environment_is_one_line(tmp_path: Path) -> None:
    done = run_main("serve", env=home_env(tmp_path, MAPLE_ACP_LOG_LEVEL="loud"))
    assert done.returncode == 1
    assert done.stderr.startswith("maple-acp: MAPLE_ACP_LOG_LEVEL: must be one of debug")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "flags",
    [
        ("--model", "m"),
        ("--provider-url", "http://127.0.0.1:9/v1"),
        ("--api-key-env", "K"),
        ("--provider-kind", "anthropic"),
    ],
)
def test_provider_flags_go_together_as_a_usage_error(
    tmp_path: Path, flags: tuple[str, str]
) -> None:
    done = run_main("serve", *flags, env=home_env(tmp_path))
    assert done.returncode == 2
    assert done.stderr.rstrip().endswith(
        "Error: --provider-url and --model go together (--api-key-env and --provider-kind "
        "are optional)"
    )
    assert "Usage: " in done.stderr


def test_a_refusal_under_json_logging_is_a_json_line(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    done = run_main(
        *("serve", "--log-format", "json", "--data-dir", str(shared)),
        *("--socket", str(tmp_path / "run" / "s.sock")),
        env=home_env(tmp_path),
    )
    assert done.returncode == 1
    entry = json.loads(done.stderr)
    assert entry["level"] == "error"
    assert entry["message"].startswith(f"cannot use the data directory {shared}")


def test_status_json_is_json_even_when_the_config_file_is_bad(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("socket = 3\n")
    done = run_main("status", "--json", "--config", str(config), env=home_env(tmp_path))
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["running"] is False
    assert report["endpoint"] is None
    assert report["reason"] == f"config file {config}: socket: must be a non-empty string"


def test_status_finds_the_socket_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'socket = "{tmp_path}/from-file.sock"\n')
    done = run_main("status", "--json", "--config", str(config), env=home_env(tmp_path))
    assert json.loads(done.stdout)["endpoint"] == f"{tmp_path}/from-file.sock"
    env = home_env(tmp_path, MAPLE_ACP_SOCKET=f"{tmp_path}/from-env.sock")
    done = run_main("status", "--json", "--config", str(config), env=env)
    assert json.loads(done.stdout)["endpoint"] == f"{tmp_path}/from-env.sock"


def test_a_transcript_shows_plans_diffs_and_locations_readably() -> None:
    lines = render_transcript(
        [
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "go"}},
            {
                "sessionUpdate": "plan",
                "entries": [
                    {"content": "read", "status": "completed", "priority": "high"},
                    {"content": "write", "status": "in_progress", "priority": "high"},
                    {"content": "test", "status": "pending", "priority": "low"},
                ],
            },
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "t1",
                "title": "write_file: a.txt",
                "status": "pending",
            },
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "writing"},
                "messageId": "m1",
            },
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "t1",
                "status": "completed",
                "locations": [{"path": "/p/a.txt", "line": 2}],
                "content": [
                    {
                        "type": "diff",
                        "path": "/p/a.txt",
                        "oldText": "one\ntwo\n",
                        "newText": "one\n2\n",
                    }
                ],
            },
        ]
    )
    assert lines == [
        "user:",
        "  go",
        "plan:",
        "  [x] read",
        "  [>] write",
        "  [ ] test",
        "tool: write_file: a.txt [completed]",
        "  at /p/a.txt:2",
        "  diff /p/a.txt",
        "    @@ -1,2 +1,2 @@",
        "     one",
        "    -two",
        "    +2",
        "agent:",
        "  writing",
    ]


TESTING_IMPORTS = ("from maple_acp.testing", "import maple_acp.testing")


def test_the_command_line_does_not_load_the_test_helpers() -> None:
    """The CLI is a client of its own (maple_acp.cli._client), never of maple_acp.testing."""
    code = (
        "import sys, maple_acp.cli, maple_acp.config, maple_acp.cli._client;"
        "loaded = [m for m in sys.modules if m.startswith('maple_acp.testing')];"
        "assert not loaded, loaded"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    package = Path(__file__).parents[1] / "maple_acp" / "cli"
    sources = sorted(package.glob("*.py"))
    assert len(sources) > 1
    for source in sources:
        imports = [line.strip() for line in source.read_text().splitlines()]
        assert not [line for line in imports if line.startswith(TESTING_IMPORTS)], source


# -- the command line's own ACP client, against a scripted peer on a socket pair --------------


def scripted_client(
    *lines: bytes, idle: float = 5.0
) -> tuple[LineClient, socket.socket, socket.socket]:
    mine, host = socket.socketpair()
    host.sendall(b"".join(lines))
    client = LineClient(mine.fileno(), mine.sendall, idle_timeout=idle, peer="the test host")
    return client, mine, host


def sent_lines(host: socket.socket) -> list[dict[str, object]]:
    host.settimeout(1)
    data = b""
    try:
        while chunk := host.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return [json.loads(line) for line in data.splitlines() if line]


def test_client_records_updates_and_answers_unserved_requests_with_method_not_found() -> None:
    update = {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk"}}
    client, mine, host = scripted_client(
        json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": update}).encode()
        + b"\n\n",
        b'{"jsonrpc":"2.0","id":"x","method":"fs/read_text_file","params":{}}\n',
        b'{"jsonrpc":"2.0","id":1,"result":{"ok":true}}\n',
    )
    with mine, host:
        assert client.request("anything", {}) == {"ok": True}
        assert client.updates == [update]
        sent = sent_lines(host)
    assert sent[0]["method"] == "anything"
    assert sent[1] == {
        "jsonrpc": "2.0",
        "id": "x",
        "error": {
            "code": -32601,
            "message": "fs/read_text_file is not served",
            "data": {"details": "fs/read_text_file is not served"},
        },
    }


def test_client_turns_an_error_answer_into_one_line() -> None:
    client, mine, host = scripted_client(
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"unknown session"}}\n'
    )
    with mine, host, pytest.raises(AcpCallError) as caught:
        client.request("session/load", {})
    # The line a person reads carries no JSON-RPC code; the code stays on the exception.
    assert str(caught.value) == "session/load failed: unknown session"
    assert caught.value.code == -32002


@pytest.mark.parametrize(
    ("lines", "close", "expected"),
    [
        ([b"this is not json\n"], False, "the test host sent a line that is not JSON"),
        ([b'{"jsonrpc":"2.0","id":1'], True, "the test host closed the connection"),
        ([], False, "the test host sent nothing for 0 s; giving up"),
        ([b"x" * 300], False, "the test host sent a line over 256 bytes"),
    ],
)
def test_client_gives_up_on_a_bad_host_with_one_line(
    monkeypatch: pytest.MonkeyPatch, lines: list[bytes], close: bool, expected: str
) -> None:
    monkeypatch.setattr(_cli_client, "MAX_LINE_BYTES", 256)
    client, mine, host = scripted_client(*lines, idle=0.05)
    with mine, host:
        if close:
            host.shutdown(socket.SHUT_WR)
        with pytest.raises(HostUnavailable) as caught:
            client.request("initialize", {})
    assert str(caught.value) == expected


def test_a_transcript_cannot_drive_the_terminal() -> None:
    assert printable("ok\tline\nnext") == "ok\tline\nnext"
    assert printable("\x1b[2J\x07\x9b") == "\\x1b[2J\\x07\\x9b"
