"""One host at a time on a data directory: opening the store locks it (a lock file beside the
store file), a second open is refused naming the directory and the holder's PID, and the lock
goes with the holder: its close, or its death."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from maple_acp._exceptions import MapleAcpError
from maple_acp.store import DataDirectoryLocked, StoreError
from maple_acp.store._lock import LOCK_SUFFIX
from maple_acp.testing.store import STORE_FILE_NAME, open_temp_store, task_record, temp_store

#: Generous: the child only has to import the store and open a file.
CHILD_READY_S = 30
REPO_ROOT = Path(__file__).resolve().parents[2]

#: A host stand-in in another process: open the store, say so, and hold it until killed.
HOLDER = """
import sys, trio
from maple_acp.testing.store import open_temp_store

async def main() -> None:
    await open_temp_store(sys.argv[1])
    sys.stdout.write("OPEN\\n")
    sys.stdout.flush()
    await trio.sleep_forever()

trio.run(main)
"""


async def test_a_second_open_of_one_store_is_refused_naming_the_directory_and_the_holder(
    tmp_path: Path,
) -> None:
    async with temp_store(tmp_path) as first:
        await first.create_task(task_record(id="kept"))
        with pytest.raises(DataDirectoryLocked) as refused:
            await open_temp_store(tmp_path)
        assert isinstance(refused.value, StoreError)
        assert isinstance(refused.value, MapleAcpError)
        message = str(refused.value)
        assert "\n" not in message
        assert str(tmp_path) in message
        assert f"PID {os.getpid()}" in message
        assert (refused.value.directory, refused.value.holder_pid) == (str(tmp_path), os.getpid())
        # The refused open changed nothing for the holder.
        await first.create_task(task_record(id="after"))
        assert await first.get_task("kept") is not None
    async with temp_store(tmp_path) as reopened:
        assert await reopened.get_task("after") is not None


async def test_a_holder_in_another_process_is_named_and_its_death_frees_the_directory(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    lock_file = tmp_path / (STORE_FILE_NAME + LOCK_SUFFIX)
    async with trio.open_nursery() as nursery:
        holder: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-c", HOLDER, str(tmp_path)],
                stdout=subprocess.PIPE,
                check=False,
                env=env,
            )
        )
        assert holder.stdout is not None
        with trio.fail_after(CHILD_READY_S):
            assert await holder.stdout.receive_some() == b"OPEN\n"
        with pytest.raises(DataDirectoryLocked, match=f"PID {holder.pid}\\)"):
            await open_temp_store(tmp_path)
        holder.send_signal(signal.SIGKILL)
        assert await holder.wait() == -signal.SIGKILL
    # The dead holder's file is still there, naming it; the next host takes it over.
    assert lock_file.read_text() == f"{holder.pid}\n"
    async with temp_store(tmp_path):
        assert lock_file.read_text() == f"{os.getpid()}\n"


async def test_the_lock_file_is_private_and_no_child_inherits_the_lock(tmp_path: Path) -> None:
    store = await open_temp_store(tmp_path)
    lock_file = tmp_path / (STORE_FILE_NAME + LOCK_SUFFIX)
    assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600
    # A child started while the store is open (as a tool's shell would be) and still running
    # after the store closed must not keep the directory locked.
    child = await trio.lowlevel.open_process(["sleep", "30"], close_fds=False)
    try:
        await store.aclose()
        async with temp_store(tmp_path) as reopened:
            assert await reopened.get_task("none") is None
    finally:
        child.kill()
        await child.wait()


async def test_a_failed_open_leaves_the_directory_unlocked(tmp_path: Path) -> None:
    store_file = tmp_path / STORE_FILE_NAME
    store_file.write_bytes(b"not a database, " * 512)
    with pytest.raises(StoreError) as refused:
        await open_temp_store(tmp_path)
    assert not isinstance(refused.value, DataDirectoryLocked)
    store_file.unlink()
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
