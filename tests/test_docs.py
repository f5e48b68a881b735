"""Every snippet in the README and docs/ runs as written, or is checked for what it is.

- A Python block that is a whole program runs in a fresh account (an empty home) and serves a
  prompt; any other Python block must be an excerpt of a file in examples/ (which its own test
  runs).
- JSON, TOML, plist and systemd blocks parse, and TOML goes through the config file's checks
  (and the provider backend's, for a provider section).
- Every ``maple-acp`` command line names a real command with real options.
"""

from __future__ import annotations

import json
import os
import plistlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

from maple_acp.cli import cli
from maple_acp.cli._client import connect_host, initialize
from maple_acp.config import parse_config
from maple_acp_connector.endpoint import endpoint_path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
#: Bounds a hang of the program under test; each step takes well under a second.
DEADLINE = 30.0

_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(lang: str) -> list[tuple[str, str]]:
    """``(where, text)`` of every fenced block of ``lang`` in the docs."""
    found = []
    for path in DOCS:
        for match in _FENCE.finditer(path.read_text()):
            if match["lang"] == lang:
                line = path.read_text()[: match.start()].count("\n") + 1
                found.append((f"{path.relative_to(REPO)}:{line}", match["body"]))
    return found


def command_lines() -> list[tuple[str, list[str]]]:
    """Every ``maple-acp ...`` command in a shell block, fenced or indented (synopsis lines
    with ``[optional]`` parts are skipped), as its arguments after the program."""
    found = []
    program = re.compile(r"^(?:\S*/)?maple-acp (?P<args>.*)$")
    for path in DOCS:
        text = path.read_text()
        candidates = [m["body"] for m in _FENCE.finditer(text) if m["lang"] in ("", "sh")]
        candidates.append(
            "\n".join(line[4:] for line in text.splitlines() if line.startswith("    "))
        )
        for body in candidates:
            for raw in body.splitlines():
                line = raw.split("  #", 1)[0].strip()
                match = program.match(line)
                if match is None or "[" in line or "|" in line:
                    continue
                found.append((f"{path.relative_to(REPO)}: {line}", shlex.split(match["args"])))
    return found


def named(items: Iterable[tuple[str, Any]]) -> list[Any]:
    """Parameters named by where they are in the docs."""
    return [pytest.param(where, value, id=where) for where, value in items]


def is_program(code: str) -> bool:
    return "trio.run(" in code or "asyncio.run(" in code


def test_the_docs_have_the_snippets_these_tests_check() -> None:
    """Guards the extraction itself: a test over zero snippets would pass vacuously."""
    assert any(is_program(code) for _, code in blocks("python"))
    assert len(blocks("json")) >= 4
    assert len(blocks("toml")) >= 2
    assert blocks("xml")
    assert blocks("ini")
    assert len(command_lines()) >= 8


@pytest.mark.parametrize(
    ("where", "code"), named(b for b in blocks("python") if not is_program(b[1]))
)
def test_a_python_fragment_is_an_excerpt_of_an_example(where: str, code: str) -> None:
    wanted = [line.strip() for line in textwrap.dedent(code).strip().splitlines()]
    for example in EXAMPLES:
        lines = [line.strip() for line in example.read_text().splitlines()]
        for start in range(len(lines) - len(wanted) + 1):
            if lines[start : start + len(wanted)] == wanted:
                return
    pytest.fail(f"{where}: this fragment is in no file of examples/")


@pytest.mark.parametrize(("where", "text"), named(blocks("json")))
def test_json_snippets_parse(where: str, text: str) -> None:
    json.loads(text)


@pytest.mark.parametrize(("where", "text"), named(blocks("toml")))
def test_toml_snippets_pass_the_config_checks(where: str, text: str, tmp_path: Path) -> None:
    config = parse_config(text, tmp_path / "config.toml")
    if config.providers:
        backends = pytest.importorskip("maple_acp.backends")
        backends.load_provider_config(config.providers, where)


@pytest.mark.parametrize(("where", "line"), named(command_lines()))
def test_documented_commands_use_real_commands_and_options(where: str, line: list[str]) -> None:
    if line[:1] == ["acp"]:
        # The connector parses its own arguments (before click is ever imported).
        assert set(line[1:]) <= {"--socket", *line[2::2]}, where
        return
    # click reads every argument (refusing an unknown command or option) before --help acts.
    result = CliRunner().invoke(cli, [*line, "--help"])
    assert result.exit_code == 0, f"{where}: {result.output}"


def test_the_service_files_start_serve_with_real_options() -> None:
    (where, unit), *_ = blocks("ini")
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.MULTILINE)
    assert exec_start is not None, where
    args = shlex.split(exec_start[1])
    assert args[0].endswith("/maple-acp")
    assert CliRunner().invoke(cli, [*args[1:], "--help"]).exit_code == 0
    assert re.search(r"^Restart=on-failure$", unit, re.MULTILINE)

    (where, plist_text), *_ = blocks("xml")
    agent = plistlib.loads(plist_text.encode())
    assert agent["ProgramArguments"][0].endswith("/maple-acp")
    assert CliRunner().invoke(cli, [*agent["ProgramArguments"][1:], "--help"]).exit_code == 0
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["StandardErrorPath"]


@pytest.fixture
def fresh_account(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a new account: an empty home and a private runtime directory with a
    short path (a socket path must fit in sun_path; pytest's tmp_path may not)."""
    home = tmp_path / "home"
    home.mkdir()
    runtime_dir = Path(tempfile.mkdtemp(prefix="macp-"))
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MAPLE_ACP_", "XDG_"))
    }
    env.update(HOME=os.fspath(home), XDG_RUNTIME_DIR=os.fspath(runtime_dir))
    try:
        yield env
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)


def is_server(code: str) -> bool:
    return ".start(" in code and "AcpService" in code


@pytest.mark.parametrize(
    ("where", "code"),
    named(b for b in blocks("python") if is_program(b[1]) and not is_server(b[1])),
)
def test_a_python_program_runs_to_completion(
    where: str, code: str, tmp_path: Path, fresh_account: dict[str, str]
) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, os.fspath(script)],
        capture_output=True,
        text=True,
        env=fresh_account,
        timeout=DEADLINE,
        check=False,
    )
    assert done.returncode == 0, f"{where}:\n{done.stderr}"


@pytest.mark.parametrize(
    ("where", "code"),
    named(b for b in blocks("python") if is_server(b[1])),
)
async def test_a_host_program_serves_a_prompt_on_a_fresh_account(
    where: str, code: str, tmp_path: Path, fresh_account: dict[str, str]
) -> None:
    env = fresh_account
    home = Path(env["HOME"])
    (home / "project").mkdir()
    script = tmp_path / "snippet.py"
    script.write_text(code)
    endpoint = endpoint_path(env=env)

    def one_prompt() -> str:
        with connect_host(endpoint, idle_timeout=DEADLINE) as client:
            initialize(client)
            cwd = os.fspath(home / "project")
            session = client.request("session/new", {"cwd": cwd, "mcpServers": []})["sessionId"]
            prompt = [{"type": "text", "text": "hello from the docs"}]
            answer = client.request("session/prompt", {"sessionId": session, "prompt": prompt})
            assert answer["stopReason"] == "end_turn"
            return "".join(
                u["update"]["content"]["text"]
                for u in client.updates
                if u["update"].get("sessionUpdate") == "agent_message_chunk"
            )

    with (tmp_path / "stderr").open("wb") as stderr, trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [sys.executable, os.fspath(script)],
                    stdin=subprocess.DEVNULL,
                    stderr=stderr,
                    check=False,
                    env=env,
                )
            )
            # The program prints nothing when ready: wait for its socket (or for its exit).
            while not endpoint.is_socket():
                if process.returncode is not None:
                    pytest.fail(f"{where}: exited early:\n{(tmp_path / 'stderr').read_text()}")
                await trio.sleep(0.02)
            assert await trio.to_thread.run_sync(one_prompt) == "hello from the docs"
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0, (tmp_path / "stderr").read_text()
    assert not endpoint.exists()
    data = home / ".local" / "share" / "my-host"
    assert (data / "tasks.sqlite3").is_file()
    for directory in (home / ".local", home / ".local" / "share", data):
        assert directory.stat().st_mode & 0o777 == 0o700, directory


def test_a_missing_schema_fails_the_run_in_one_line(tmp_path: Path) -> None:
    """README: a schema the suite cannot find or fetch fails the run, CI or not; never a skip."""
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_nothing() -> None:\n    pass\n")
    # tests/conftest.py loaded as a plugin by name: its pytest_configure is what is tested.
    path = os.pathsep.join(filter(None, [os.fspath(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "ACP_SCHEMA_DIR": os.fspath(tmp_path / "no-schema"),
        "PYTHONPATH": path,
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest"]
    done = subprocess.run(
        [*command, os.fspath(probe)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    (line,) = [
        line for line in (done.stdout + done.stderr).splitlines() if "ACP_SCHEMA_DIR" in line
    ]
    assert "holds no schema.json" in line
    assert "set ACP_SCHEMA_DIR to the directory holding schema.json" in line


def test_ci_script_runs_exactly_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    command = next(
        line.strip() for line in readme.splitlines() if line.strip().endswith("-m pytest")
    )
    ci = (REPO / ".ci" / "run").read_text()
    assert command in ci
    assert "-eq 5" in ci  # "no tests collected" is a failure, not a pass
    # It builds its own environment in a copy of the tree: a developer's .venv is left alone.
    assert "rm -rf .venv" not in ci
    assert 'cd "$tree"' in ci.split(command)[0]


#: Files and directories whose text is the repository's own (what a clone holds).
OWN_TEXT = ["maple_acp", "connector", "tests", "fuzz", "bench", "docs", "examples", ".ci"]
OWN_FILES = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md", "noxfile.py", "pyproject.toml"]
#: The schema lookup (and the CI script that hides it) may name the directory beside a
#: checkout where the ACP schema is found.
SCHEMA_LOOKUP = {
    "maple_acp/testing/schema_source.py",
    "maple_acp/testing/schema.py",
    "tests/test_schema_source.py",
    ".ci/run",
}
_OUTSIDE_CITATION = re.compile(r"\b(?:SPEC|PERF)(?:\.md)?\b|\.\./shared(?!/acp-schema)")


def own_text_files() -> Iterator[Path]:
    for name in OWN_FILES:
        if (REPO / name).is_file():
            yield REPO / name
    for name in OWN_TEXT:
        for path in sorted((REPO / name).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".md", ".toml", ".txt", ".cfg", ""}:
                yield path


def test_the_repository_cites_no_document_outside_it() -> None:
    """What the code relies on is said in docs/, not in a file no clone contains."""
    found = []
    for path in own_text_files():
        relative = path.relative_to(REPO).as_posix()
        if relative in SCHEMA_LOOKUP or path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE_CITATION.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []


def test_the_citation_check_sees_a_citation() -> None:
    # The names are put together here so that this file does not cite what it forbids.
    for name in ("SPEC", "PERF"):
        assert _OUTSIDE_CITATION.search(f"reads pay an mmap ({name}.md limits)")
    assert _OUTSIDE_CITATION.search("see " + "../" + "shared/notes")
    assert not _OUTSIDE_CITATION.search("`../shared/acp-schema/v1` beside the checkout")
    assert not _OUTSIDE_CITATION.search("_SPECIAL = {}")


def test_clients_page_says_what_each_known_client_shows_on_a_cancel_during_a_permission() -> None:
    page = (REPO / "docs" / "clients.md").read_text()
    section = page.split("## Cancelling while a permission question waits", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| client") and "---" not in line
    }
    for client in ("Zed", "Toad", "acpx", "Paseo", "JetBrains", "SDKs"):
        [said] = [text for name, text in rows.items() if client in name]
        assert said, client
