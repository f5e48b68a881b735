"""``maple-acp serve`` makes its process non-dumpable first thing, and says so at DEBUG; on a
system without the flag it serves as ever. What the flag refuses to a process of the same
user (``/proc/<pid>/environ``, ``/proc/<pid>/mem``, ``ptrace``) is shown in
tests/test_hardening.py with a host and its children running as ``nobody``: the suite runs as
root, and root reads any process."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from .host_processes import DEADLINE, running_host

HARDENED_LINE = "the host process is not dumpable"


async def test_serve_makes_its_process_non_dumpable_at_start(short_dir: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir, "--log-level", "debug") as host:
            assert await host.status()
            said = HARDENED_LINE in host.stderr.text
    assert said is sys.platform.startswith("linux")
