"""A stuck test fails with where it was stuck instead of hanging the run (tests/deadlines.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).parent / "deadline_probe.py"


def test_a_livelocked_trio_test_fails_after_its_real_time_deadline_naming_each_task() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PROBE)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the test did not end within 1 s of real time" in done.stdout
    # Where each task was: the test waiting on its (virtual) deadline, the spinning task.
    assert f"{PROBE}:23 in test_stuck_in_a_livelock" in done.stdout
    assert f"{PROBE}:18 in spin" in done.stdout
    assert "1 failed" in done.stdout
