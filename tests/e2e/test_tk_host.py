"""``examples/tk_host.py``: a Tk window running the runtime and the ACP service in Trio guest
mode, on a virtual X display, serves a session driven through the real connector
(``maple-acp acp``) and shows it.

The window's own debug hook (``--debug-shown``) writes what its widgets show at each redraw;
the test reads those lines, presses its buttons through the hook's stdin, and saves a
screenshot of the screen (``.test-artifacts/tk_host.png``, or ``$TEST_ARTIFACTS_DIR``).
Without Tk, Xvfb or xwd the test skips, except under CI, where it fails (``.ci/run`` installs
them when it runs as root).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.testing.schema import AcpSchema

from .host_processes import (
    DEADLINE,
    MAPLE_ACP,
    LineReader,
    clean_env,
    connector_client,
    example_command,
)
from .x_display import (
    artifacts_dir,
    display_tools_missing,
    png_pixels,
    screenshot_png,
    under_ci,
    virtual_display,
    without_tools,
)

EXAMPLE = "tk_host.py"
SHOWN = "tk host: shown "

#: The whole window scenario (a Tk host's start, a session, a cancel, stop and start, its exit):
#: several processes' start-ups, which a loaded machine stretched past the one-step deadline.
WINDOW_DEADLINE_S = 3 * DEADLINE


@pytest.fixture
def display_tools() -> None:
    """Skip (or fail, under CI) when the window's tools are missing. A plain fixture: a skip
    raised inside an async one reaches pytest without its reason, and a newcomer sees only
    "Skipped" with no word on what to install."""
    verdict = without_tools(display_tools_missing(), ci=under_ci(os.environ))
    if verdict is not None:
        action, reason = verdict
        (pytest.fail if action == "fail" else pytest.skip)(reason)


@pytest.fixture
async def display(display_tools: None) -> AsyncIterator[str]:
    async with virtual_display() as value:
        yield value


class Window:
    """The example's process: its stderr lines, and its debug hook's stdin."""

    def __init__(self, process: trio.Process, stderr: LineReader) -> None:
        self.process = process
        self.stderr = stderr
        #: Where the next ``shows`` starts reading: a redraw is matched once, in order.
        self._next_line = 0

    async def shows(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The next redraw whose widgets satisfy ``predicate`` (already written or to come)."""

        def matches(line: str) -> bool:
            return line.startswith(SHOWN) and predicate(json.loads(line[len(SHOWN) :]))

        index = await self.stderr.wait_index(matches, self._next_line)
        self._next_line = index + 1
        shown: dict[str, Any] = json.loads(self.stderr.lines[index][len(SHOWN) :])
        return shown

    async def press(self, button: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(f"press {button}\n".encode())


@asynccontextmanager
async def tk_host(command: list[str], display: str) -> AsyncIterator[Window]:
    """The example, serving, until the block ends; then SIGTERM unless it already exited."""
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=False,
                env=clean_env(DISPLAY=display),
            )
        )
        assert process.stderr is not None
        stderr = LineReader()
        nursery.start_soon(stderr.pump, process.stderr)
        await stderr.wait_for(lambda line: line.startswith("tk host: serving on"))
        try:
            yield Window(process, stderr)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            await process.wait()
            await stderr.wait_closed()


def _serving(shown: dict[str, Any]) -> bool:
    return shown["service"] == "Service: serving" and shown["stop"] and not shown["start"]


async def test_the_window_shows_a_session_driven_through_the_connector(
    short_dir: Path, project: Path, acp_schema: AcpSchema, display: str
) -> None:
    socket_path = short_dir / "run" / "acp.sock"
    command = [*example_command(EXAMPLE, socket_path, short_dir / "data"), "--debug-shown"]
    with trio.fail_after(WINDOW_DEADLINE_S):
        async with tk_host(command, display) as window:
            shown = await window.shows(_serving)
            assert shown["socket"] == f"Socket: {socket_path}"
            assert shown["connections"] == shown["sessions"] == []

            # The connector a client launches, pointed at the window's socket.
            async with connector_client(socket_path, command=[*MAPLE_ACP, "acp"]) as connector:
                client = connector.client
                await client.initialize()
                session_id = (await client.new_session(os.fspath(project)))["sessionId"]
                answer = await client.prompt(session_id, "hello from the Tk test")
                assert answer["stopReason"] == "end_turn"
                assert client.text(session_id) == "hello from the Tk test"

                shown = await window.shows(
                    lambda shown: (
                        shown["connections"] == [["1", session_id, "0"]]
                        and [row[0] for row in shown["sessions"]] == [session_id]
                        and shown["sessions"][0][-1] == "idle"
                    )
                )
                _, root, _title, mode, _ = shown["sessions"][0]
                assert (root, mode) == (os.fspath(project.resolve()), "code")
                assert any(f"session {session_id} created" in line for line in shown["log"])
                # What a person would see: the screen, saved for the run's artifacts.
                png = await screenshot_png(display)
                (artifacts_dir(os.environ) / "tk_host.png").write_bytes(png)
                width, height, colours = png_pixels(png)
                assert (width, height) == (800, 600)
                assert len(colours) > 2, "the screen shows no window"

                # A turn that runs until cancelled: the window shows it running, then idle.
                answers: list[Any] = []

                async def hang() -> None:
                    answers.append(await client.prompt(session_id, "/hang"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hang)
                    await window.shows(
                        lambda shown: (
                            shown["connections"] == [["1", session_id, "1"]]
                            and shown["sessions"][0][-1] == "running"
                        )
                    )
                    await client.cancel(session_id)
                assert answers[0]["stopReason"] == "cancelled"
                await window.shows(
                    lambda shown: (
                        shown["connections"] == [["1", session_id, "0"]]
                        and shown["sessions"][0][-1] == "idle"
                    )
                )
                client.validate(acp_schema)

            # The client went away: its connection and session leave the window.
            await window.shows(lambda shown: shown["connections"] == shown["sessions"] == [])

            # Stop and Start do what they say, and the window follows.
            await window.press("stop")
            shown = await window.shows(lambda shown: shown["service"] == "Service: stopped")
            assert (shown["start"], shown["stop"]) == (True, False)
            assert not socket_path.exists()
            await window.press("start")
            await window.shows(_serving)
            assert socket_path.is_socket()

    assert window.process.returncode == 0, window.stderr.text
    assert window.stderr.lines[-1] == "tk host: stopped"
    assert not socket_path.exists()
    assert not any("Traceback" in line for line in window.stderr.lines)


def test_without_the_tools_the_window_test_skips_only_outside_ci(tmp_path: Path) -> None:
    missing = display_tools_missing(path=os.fspath(tmp_path))  # a PATH with no programs
    assert "Xvfb (xvfb)" in missing
    assert "xwd (x11-apps)" in missing
    action, reason = without_tools(missing, ci=False) or ("run", "")
    assert action == "skip"
    assert "Xvfb (xvfb)" in reason
    action, reason = without_tools(missing, ci=True) or ("run", "")
    assert action == "fail"
    assert ".ci/run installs them" in reason
    assert without_tools([], ci=True) is None


@pytest.mark.parametrize("ci", [False, True], ids=["developer", "ci"])
def test_a_run_without_the_tools_says_why_the_window_test_did_not_run(
    tmp_path: Path, ci: bool
) -> None:
    """What a newcomer's own run prints: the reason next to the skip (or, under CI, the
    failure), never a bare "Skipped" pointing into pytest."""
    window_test = (
        f"{Path(__file__)}::{test_the_window_shows_a_session_driven_through_the_connector.__name__}"
    )
    env = {key: value for key, value in clean_env().items() if key != "CI"}
    # No program on PATH: Xvfb and xwd are missing whatever this machine has.
    env.update(PATH=os.fspath(tmp_path), HOME=os.fspath(tmp_path), **({"CI": "true"} if ci else {}))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", window_test, "-q", "-rsE", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
        timeout=DEADLINE,
        check=False,
    )
    assert "a window test needs" in done.stdout, done.stdout
    assert "Xvfb (xvfb)" in done.stdout
    if ci:
        assert done.returncode == 1
        assert "under CI it must run" in done.stdout
    else:
        assert done.returncode == 0
        assert "1 skipped" in done.stdout
