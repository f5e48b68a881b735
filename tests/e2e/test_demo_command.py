"""``maple-acp demo``: a scripted session through a real connector, printed as a transcript."""

from __future__ import annotations

from .host_processes import DEADLINE, MAPLE_ACP, run_command


def test_demo_runs_a_whole_session_through_a_real_connector() -> None:
    done = run_command([*MAPLE_ACP, "demo"], timeout=DEADLINE * 2)
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
