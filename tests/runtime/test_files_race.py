"""The native file tools never leave the project root, even while another thread swaps a
directory of the path for a symlink to outside (``renameat2(RENAME_EXCHANGE)``); and the plain
refusals (symlinks anywhere, ``..`` above the root) hold with ``openat2`` and with the
per-component walk alike. Real directories, real symlinks, a real swapping thread."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from maple_acp.runtime import (
    AgentService,
    PermissionRequest,
    RunState,
    ToolRow,
    ToolStatus,
    _beneath,
)
from maple_acp.runtime._files import (
    FileToolError,
    edit_text,
    read_text,
    resolve_in_root,
    write_text,
)

#: Calls per racing case: the unfixed tools escape within a few dozen.
RACE_TRIES = 300
#: A racing case gives up after this long whatever the count (keeps the suite fast).
RACE_SECONDS = 0.5
#: Demo prompts racing the swap (each a whole run: slower than a direct call).
DEMO_TRIES = 60
DEMO_SECONDS = 2.0
#: The swapping thread rests every this many swaps (odd: it rests in both states by turns).
PAUSE_EVERY = 63
PAUSE_SECONDS = 0.0001
RENAME_EXCHANGE = 2
AT_FDCWD = -100
INSIDE = "inside TOKEN\n"
SECRET = "outside TOKEN\n"
SYMLINK_REFUSAL = (
    "is or goes through a symlink, which file tools do not follow:"
    " it could lead outside the session's project directory"
)


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        monkeypatch.setattr(_beneath, "use_openat2", None)
        probe = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not _beneath._openat2_works(probe):
                pytest.skip("this kernel has no usable openat2")
        finally:
            os.close(probe)
    else:
        monkeypatch.setattr(_beneath, "use_openat2", False)
    return str(request.param)


def _renameat2() -> Callable[[bytes, bytes], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "renameat2", None)
    if function is None:
        return None

    def exchange(first: bytes, second: bytes) -> int:
        result: int = function(AT_FDCWD, first, AT_FDCWD, second, RENAME_EXCHANGE)
        return result

    return exchange


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``project/racedir/race.txt`` (inside) and ``project/racealt`` → ``outside``, which
    holds a ``race.txt`` of its own that must never be read or touched."""
    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / "racedir").mkdir(parents=True)
    outside.mkdir()
    (project / "racedir" / "race.txt").write_text(INSIDE)
    (outside / "race.txt").write_text(SECRET)
    (project / "racealt").symlink_to(outside)
    return project, outside


@pytest.fixture
def swapping(layout: tuple[Path, Path]) -> Iterator[None]:
    """A thread exchanging ``racedir`` and ``racealt`` in a tight loop while the test runs."""
    exchange = _renameat2()
    project, _ = layout
    first, second = bytes(project / "racedir"), bytes(project / "racealt")
    if exchange is None:
        pytest.skip("renameat2 is unavailable on this platform")
    if exchange(first, second) != 0:
        reason = errno.errorcode.get(ctypes.get_errno(), "unknown error")
        pytest.skip(f"renameat2(RENAME_EXCHANGE) does not work here ({reason})")
    stop = threading.Event()

    def swap() -> None:
        swaps = 0
        while not stop.is_set():
            exchange(first, second)
            swaps += 1
            if swaps % PAUSE_EVERY == 0:
                # A short rest, in either state by turns, so the calls cannot fall into step
                # with the swaps and always meet the same state.
                time.sleep(PAUSE_SECONDS)

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _call(op: str, project: Path) -> str | None:
    """One tool call through ``racedir``; the text it read or wrote over, if any."""
    path = "racedir/race.txt"
    if op == "read":
        return read_text(str(project), path).text
    if op == "write":
        return write_text(str(project), path, INSIDE).old_text
    return edit_text(str(project), path, "TOKEN", "TOKEN").old_text


@pytest.mark.parametrize("op", ["read", "write", "edit"])
@pytest.mark.usefixtures("swapping")
def test_swapped_directory_never_escapes(layout: tuple[Path, Path], mode: str, op: str) -> None:
    project, outside = layout
    secret_file = outside / "race.txt"
    before = secret_file.stat().st_mtime_ns
    succeeded = tries = 0
    refusals: set[str] = set()
    escaped: list[str] = []
    deadline = time.monotonic() + RACE_SECONDS
    while tries < RACE_TRIES and time.monotonic() < deadline and not escaped:
        tries += 1
        try:
            seen = _call(op, project)
        except FileToolError as exc:
            refusals.add(str(exc))
        else:
            succeeded += 1
            if seen == SECRET:
                escaped.append(f"call {tries} saw the outside file")
        if sorted(os.listdir(outside)) != ["race.txt"]:
            escaped.append(f"call {tries} created {sorted(os.listdir(outside))} outside")
        elif secret_file.stat().st_mtime_ns != before or secret_file.read_text() != SECRET:
            escaped.append(f"call {tries} wrote the outside file")
    assert not escaped, f"{op} ({mode}) escaped the project: {escaped[0]}"
    # Every refusal says why in one line: the swap put a symlink in the path.
    assert refusals == {"'racedir/race.txt' " + SYMLINK_REFUSAL}
    # Calls also got through, so the swap really raced them.
    assert succeeded > 0, (tries, len(refusals))


@pytest.mark.usefixtures("swapping")
async def test_demo_write_file_never_lands_outside(
    service: AgentService, layout: tuple[Path, Path]
) -> None:
    project, outside = layout
    secret_file = outside / "race.txt"
    before = secret_file.stat().st_mtime_ns
    prompt = "/tool write_file " + json.dumps({"path": "racedir/race.txt", "content": INSIDE})
    statuses: list[ToolStatus] = []
    refusals: set[str | None] = set()
    deadline = time.monotonic() + DEMO_SECONDS
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        while len(statuses) < DEMO_TRIES and time.monotonic() < deadline:
            run = await lease.start_run(prompt)
            rows = []
            async for event in run.events():
                if isinstance(event, PermissionRequest):
                    event.responder.answer("allow_once")
                elif isinstance(event, ToolRow):
                    rows.append(event.tool)
            statuses.append(rows[-1].status)
            assert sorted(os.listdir(outside)) == ["race.txt"]
            assert secret_file.stat().st_mtime_ns == before, f"prompt {len(statuses)} wrote outside"
            assert (await run.wait()).state is RunState.COMPLETED
            assert all(SECRET not in (d.old_text or "") for row in rows for d in row.diffs)
            if rows[-1].status is ToolStatus.FAILED:
                refusals.add(rows[-1].output_text)
        await lease.release(close=True)
    assert ToolStatus.COMPLETED in statuses
    assert refusals <= {"'racedir/race.txt' " + SYMLINK_REFUSAL}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "project"
    (directory / "src").mkdir(parents=True)
    (directory / "src" / "main.py").write_text("print('hi')\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    return directory


def _every_tool(project: Path, path: str) -> list[Callable[[], object]]:
    return [
        lambda: read_text(str(project), path),
        lambda: write_text(str(project), path, "x"),
        lambda: write_text(str(project), path, "x", dry_run=True),
        lambda: edit_text(str(project), path, "secret", "x"),
    ]


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("target", ["outside", "project/src"])
def test_a_symlinked_intermediate_directory_is_refused(project: Path, target: str) -> None:
    (project / "link").symlink_to(project.parent / target)
    for call in _every_tool(project, "link/secret.txt") + _every_tool(project, "link/main.py"):
        with pytest.raises(FileToolError, match="goes through a symlink"):
            call()
    with pytest.raises(FileToolError, match="goes through a symlink"):
        write_text(str(project), "link/deeper/new.txt", "x")
    assert sorted(os.listdir(project.parent / "outside")) == ["secret.txt"]
    assert (project / "src" / "main.py").read_text() == "print('hi')\n"


@pytest.mark.usefixtures("mode")
def test_a_symlink_as_the_final_component_is_refused(project: Path) -> None:
    (project / "secret.txt").symlink_to(project.parent / "outside" / "secret.txt")
    (project / "dangling.txt").symlink_to(project.parent / "outside" / "new.txt")
    for path in ("secret.txt", "dangling.txt"):
        for call in _every_tool(project, path):
            with pytest.raises(FileToolError, match="symlink"):
                call()
    assert sorted(os.listdir(project.parent / "outside")) == ["secret.txt"]
    assert (project.parent / "outside" / "secret.txt").read_text() == "secret\n"


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("path", ["..", "../outside/secret.txt", "src/../../outside/secret.txt"])
def test_dot_dot_above_the_root_is_refused(project: Path, path: str) -> None:
    for call in _every_tool(project, path):
        with pytest.raises(FileToolError, match="outside the session's project directory"):
            call()
    assert sorted(os.listdir(project.parent / "outside")) == ["secret.txt"]


@pytest.mark.usefixtures("mode")
def test_an_absolute_path_outside_the_root_is_refused(project: Path) -> None:
    with pytest.raises(FileToolError, match="outside the session's project directory"):
        read_text(str(project), str(project.parent / "outside" / "secret.txt"))
    with pytest.raises(FileToolError, match="outside the session's project directory"):
        write_text(str(project), str(project.parent / "outside" / "new.txt"), "x")


@pytest.mark.usefixtures("mode")
def test_a_nested_write_read_and_edit_work(project: Path) -> None:
    real = Path(os.path.realpath(project))
    change = write_text(str(project), "a/b/c/new.txt", "one\n")
    assert (change.path, change.old_text) == (str(real / "a" / "b" / "c" / "new.txt"), None)
    assert (project / "a" / "b" / "c" / "new.txt").read_text() == "one\n"
    assert read_text(str(project), "a/b/c/new.txt").text == "one\n"
    assert read_text(str(project), f"{project}/a/./b/../b/c/new.txt").text == "one\n"
    edit_text(str(project), "a/b/c/new.txt", "one", "two")
    assert write_text(str(project), "a/b/c/new.txt", "three\n").old_text == "two\n"
    assert (project / "a" / "b" / "c" / "new.txt").read_text() == "three\n"


@pytest.mark.usefixtures("mode")
def test_a_file_where_a_directory_is_expected_is_a_clear_error(project: Path) -> None:
    with pytest.raises(FileToolError, match="Not a directory"):
        write_text(str(project), "src/main.py/x.txt", "x")
    with pytest.raises(FileToolError, match="does not exist"):
        read_text(str(project), "missing/dir/x.txt")


@pytest.mark.usefixtures("mode")
def test_resolve_in_root_refuses_what_the_tools_refuse(project: Path) -> None:
    (project / "link").symlink_to(project / "src")
    (project / "alias.py").symlink_to(project / "src" / "main.py")
    for path in ("link", "link/main.py", "link/missing/new.txt", "alias.py"):
        with pytest.raises(FileToolError, match="goes through a symlink"):
            resolve_in_root(str(project), path)
    real = os.path.realpath(project)
    assert resolve_in_root(str(project), "src/main.py") == f"{real}/src/main.py"
    assert resolve_in_root(str(project), "missing/new.txt") == f"{real}/missing/new.txt"
    assert resolve_in_root(str(project), "src/main.py/x") == f"{real}/src/main.py/x"


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EPERM])
def test_a_kernel_or_filter_refusing_openat2_falls_back_to_the_walk(
    project: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def refused(dir_fd: int, name: str, flags: int, mode: int) -> int:
        raise OSError(code, os.strerror(code), name)

    monkeypatch.setattr(_beneath, "use_openat2", None)
    monkeypatch.setattr(_beneath, "_syscall", object())
    monkeypatch.setattr(_beneath, "_openat2", refused)
    assert read_text(str(project), "src/main.py").text == "print('hi')\n"
    assert _beneath.use_openat2 is False
    (project / "link").symlink_to(project.parent / "outside")
    with pytest.raises(FileToolError, match="goes through a symlink"):
        read_text(str(project), "link/secret.txt")
