"""The testing section of docs/embedding.md, followed as a host would: its Python block
(``examples/host_state_machine.py``, whole) is written as a test file into an empty directory
and run by pytest in a process of its own, with a home of its own and this suite's
interpreter. It runs the 200 examples it ships with, green (about 25 s on two busy cores).

The process imports this checkout's ``maple_acp`` (``PYTHONPATH``), gets the ACP schema the
way the section says a host's CI without network does (``ACP_SCHEMA_DIR``), and cannot import
what the ``testing`` extra leaves out (the engine SDKs, hypercorn, the ACP SDK): as in a clean
virtual environment with only ``maple-acp[testing]``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import maple_acp
from maple_acp.testing.schema_source import SCHEMA_ENV

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "embedding.md"
EXAMPLE = REPO / "examples" / "host_state_machine.py"
#: Bounds the run: 200 examples take well under a minute.
DEADLINE_S = 240.0
#: What ``maple-acp[testing]`` does not install: the process fails to import any of them.
LEFT_OUT = ("openai", "anthropic", "hypercorn", "acp")


def section_snippet() -> str:
    """The Python block of the doc's testing section."""
    section = DOC.read_text().split("## Testing your integration", 1)[1]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "the testing section shows one whole test file"
    return str(blocks[0])


def test_the_testing_section_shows_the_example_whole_and_it_fits_a_page() -> None:
    snippet = section_snippet()
    assert snippet == EXAMPLE.read_text()
    assert len(snippet.splitlines()) <= 150


def test_the_testing_section_runs_green_from_an_empty_directory(tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir(mode=0o700)
    (work / "test_host_machine.py").write_text(section_snippet())
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text(
        f"import sys\nfor name in {LEFT_OUT!r}:\n    sys.modules[name] = None\n"
    )
    checkout = Path(maple_acp.__file__).resolve().parents[1]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.fspath(home),
        "PYTHONPATH": os.pathsep.join([os.fspath(blocked), os.fspath(checkout)]),
        SCHEMA_ENV: os.environ[SCHEMA_ENV],
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_host_machine.py"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
