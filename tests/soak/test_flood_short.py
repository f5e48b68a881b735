"""The flood run, short: ``bench/bench_flood.py`` for a few seconds at half its rates against a
real ``serve --http`` (``nox -s flood`` runs it whole: 20 s at 2,000 connect-and-close and 1,000
wrong-token requests a second). It fails naming each check that did not hold: the owner lost a
prompt or a character, the Unix socket was slow to answer ``status``, the log grew, or the
host kept the files or memory the flood took."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_flood.py"


async def test_a_short_flood_costs_the_owner_nothing() -> None:
    command = [
        *(sys.executable, str(BENCH), "--seconds", "4", "--connects", "1000"),
        *("--wrong", "500", "--settle", "3"),
    ]
    with trio.fail_after(90):
        done = await trio.run_process(
            command, capture_stdout=True, stderr=subprocess.STDOUT, check=False
        )
    report = done.stdout.decode(errors="replace")
    assert done.returncode == 0, report
    assert "owner prompts during the flood" in report, report
