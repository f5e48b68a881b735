"""``maple-acp demo``: a scripted session through a real connector, printed as a transcript."""

from __future__ import annotations

import subprocess

from .conftest import DEADLINE, MAPLE_ACP, clean_env


def test_demo_runs_a_whole_session_through_a_real_connector() -> None:
    done = subprocess.run(
        [*MAPLE_ACP, "demo"],
        capture_output=True,
        text=True,
        timeout=DEADLINE * 2,
        env=clean_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    steps = [
        "-> initialize",
        "-> session/new",
        "<- agent: Hello from the maple-acp demo backend.",
        "<- session/request_permission 'shell: echo hi' options [allow_once, reject_once]",
        "-> answer allow_once",
        "completed 'shell: echo hi' output 'hi'",
        "-> session/cancel",
        "<- stopReason cancelled",
        "-> session/list",
        "-> session/load",
        "<- replay user:",
        "<- replay tool_call completed",
        "<- loaded",
        "<- closed",
        "service stopped; done",
    ]
    position = 0
    for step in steps:
        found = out.find(step, position)
        assert found >= 0, f"{step!r} missing (in order) from:\n{out}"
        position = found
    assert out.count("connector exited with status 0") == 2
    assert "Traceback" not in done.stderr
