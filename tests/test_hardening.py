"""``harden_host_process``: a host running as an unprivileged user, with a secret in its
environment, and the children it starts (a forked one, and an exec'd shell as a tool runs),
which run as the same user: after the call they can neither read ``/proc/<host>/environ``,
nor open ``/proc/<host>/mem``, nor ``ptrace`` the host; without it they can (the control, so
that the test can fail).

The test runs as root (CI does) and drops both the host and its children to ``nobody``: a
process of the user who runs the suite could not be told apart from the suite itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import maple_acp

#: The unprivileged user the host and its children run as (``nobody``).
UNPRIVILEGED: int = 65534
SECRET = "sk-hardening-test-3f9a1c"
YAMA_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")

#: The host: imports what it needs while still root (the interpreter's files may be readable
#: by root only), drops to ``nobody``, and starts its children. Changing user ids leaves a
#: process non-dumpable, so it first sets back the state of a host its own user started
#: (dumpable), then calls the library's one call, or not. argv: hardened (1/0), uid.
HOST = r"""
import ctypes, json, os, subprocess, sys, time
from maple_acp import harden_host_process

libc = ctypes.CDLL(None, use_errno=True)
hardened, uid = sys.argv[1] == "1", int(sys.argv[2])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
assert libc.prctl(4, 1, 0, 0, 0) == 0  # PR_SET_DUMPABLE 1: as if started by this user
if hardened:
    assert harden_host_process() is True
host = os.getpid()

# A child that probes its parent: environ, mem, ptrace (PTRACE_ATTACH 16, PTRACE_DETACH 17).
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    seen = {}
    try:
        with open(f"/proc/{host}/environ", "rb") as handle:
            seen["environ"] = handle.read().decode(errors="replace")
    except OSError as exc:
        seen["environ"] = f"refused: errno {exc.errno}"
    try:
        os.close(os.open(f"/proc/{host}/mem", os.O_RDONLY))
        seen["mem"] = "opened"
    except OSError as exc:
        seen["mem"] = f"refused: errno {exc.errno}"
    if libc.ptrace(16, host, 0, 0) == 0:
        os.waitpid(host, 0x40000000)  # __WALL: the attach stop
        libc.ptrace(17, host, 0, 0)
        seen["ptrace"] = "attached"
    else:
        seen["ptrace"] = f"refused: errno {ctypes.get_errno()}"
    os.write(write_end, json.dumps(seen).encode())
    os._exit(0)
os.close(write_end)
chunks = []
while chunk := os.read(read_end, 65536):
    chunks.append(chunk)
os.waitpid(child, 0)
seen = json.loads(b"".join(chunks))

# A tool child as the shell tool starts one: an exec'd shell with an allow-listed environment.
shell = subprocess.run(
    ["/bin/sh", "-c", f"cat /proc/{host}/environ"],
    env={"PATH": "/usr/bin:/bin"},
    capture_output=True,
    timeout=20,
)
seen["shell"] = {
    "status": shell.returncode,
    "out": shell.stdout.decode(errors="replace"),
    "err": shell.stderr.decode(errors="replace")[:300],
}
print(json.dumps(seen))
"""


def _needs_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the hardening test runs as root under CI (it drops to nobody)")
        pytest.skip("needs root, to run the host and its children as an unprivileged user")


def _run_host(hardened: bool) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PROVIDER_KEY": SECRET}
    result = subprocess.run(
        [sys.executable, "-c", HOST, "1" if hardened else "0", str(UNPRIVILEGED)],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    seen: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return seen


def _yama_blocks_parent_ptrace() -> bool:
    try:
        return int(YAMA_SCOPE.read_text()) >= 1
    except (OSError, ValueError):
        return False


def test_a_hardened_host_is_closed_to_its_children_of_the_same_user() -> None:
    _needs_root()
    seen = _run_host(hardened=True)
    # errno 13 (EACCES) for the /proc files, 1 (EPERM) for ptrace.
    assert seen["environ"] == "refused: errno 13"
    assert seen["mem"] == "refused: errno 13"
    assert seen["ptrace"] == "refused: errno 1"
    shell = seen["shell"]
    assert shell["status"] != 0
    assert SECRET not in shell["out"]
    assert "Permission denied" in shell["err"]


def test_without_it_the_same_children_read_the_host() -> None:
    """The control: the probes work, so the test above can fail."""
    _needs_root()
    seen = _run_host(hardened=False)
    assert f"PROVIDER_KEY={SECRET}" in seen["environ"]
    assert seen["mem"] == "opened"
    if not _yama_blocks_parent_ptrace():
        assert seen["ptrace"] == "attached"
    assert seen["shell"]["status"] == 0
    assert SECRET in seen["shell"]["out"]


def test_it_is_one_public_call() -> None:
    assert "harden_host_process" in maple_acp.__all__
    assert maple_acp.harden_host_process is maple_acp._hardening.harden_host_process
    if not sys.platform.startswith("linux"):
        assert maple_acp.harden_host_process() is False
