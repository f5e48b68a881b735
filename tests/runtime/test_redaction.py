"""Relay values never at rest: a tool that prints one leaves only ``[relay:NAME]`` in the
store (its -wal and -shm files included, while the run is live and after), the events, and
the logs at DEBUG."""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

import pytest
import trio

from maple_acp._text import CUT_DIFF
from maple_acp.model import FileDiff, ItemKind, ToolLocation, ToolState, ToolStatus
from maple_acp.runtime import (
    AgentService,
    PermissionRequest,
    RunEvent,
    SessionLease,
    ToolRow,
)
from maple_acp.runtime._relay import RelayRedactor
from maple_acp.runtime._tool_rows import MAX_DIFF_SIDE_CHARS, prepared_tool
from maple_acp.testing.store import STORE_FILE_NAME


def store_files(data: Path) -> list[Path]:
    files = [data / name for name in (STORE_FILE_NAME, f"{STORE_FILE_NAME}-wal")]
    shm = data / f"{STORE_FILE_NAME}-shm"
    return files + ([shm] if shm.exists() else [])


def assert_absent(secret: str, data: Path) -> None:
    needle = secret.encode()
    for path in store_files(data):
        assert path.exists(), path
        assert needle not in path.read_bytes(), f"the relay value is in {path.name}"


async def test_a_printed_relay_value_is_never_stored_sent_or_logged(
    service: AgentService, project: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    data = tmp_path / "data"
    secret = "relay-" + secrets.token_hex(12)
    command = json.dumps({"command": "echo value=$MAPLE_TOKEN; echo ${MAPLE_TOKEN}tail"})
    seen: list[RunEvent] = []
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project),
                relay=service.accept_relay({"MAPLE_TOKEN": secret}),
                task_status=task_status,
            )
        )
        run = await lease.start_run(f"/tool shell {command}\n/hang")
        events = run.events()
        async for event in events:
            seen.append(event)
            if isinstance(event, PermissionRequest):
                assert event.responder.answer("allow_once")
            if isinstance(event, ToolRow) and event.tool.status.terminal:
                break
        # The run is live (it hangs now): the row is in the store, the value is not.
        assert run.outcome is None
        assert_absent(secret, data)
        history = await lease.history()
        tool_items = [item for item in history if item.kind is ItemKind.TOOL]
        assert tool_items
        assert tool_items[-1].tool is not None
        final = tool_items[-1].tool
        assert final.output_text is not None
        assert "value=[relay:MAPLE_TOKEN]" in final.output_text
        assert "[relay:MAPLE_TOKEN]tail" in final.output_text
        assert "[relay:MAPLE_TOKEN]" in json.dumps(final.raw_output)
        run.cancel()
        seen.extend([event async for event in events])
        await lease.release(close=False)
    assert_absent(secret, data)
    assert secret not in repr(seen)
    assert any(
        isinstance(e, ToolRow) and "[relay:MAPLE_TOKEN]" in (e.tool.output_text or "") for e in seen
    )
    assert caplog.records, "DEBUG logging was captured"
    assert secret not in caplog.text
    for record in caplog.records:
        assert secret not in record.getMessage()


def test_every_field_of_a_tool_row_is_redacted_and_bounded() -> None:
    secret = "S3CRET-VALUE-123"
    redactor = RelayRedactor({"TOKEN": secret, "SHORT": "abc", "LONGER": secret + "-xyz"})
    tool = ToolState(
        name="write_file",
        status=ToolStatus.COMPLETED,
        title=f"write {secret}",
        raw_input={"content": [secret, {secret: secret + "-xyz"}]},
        raw_output={"n": 1},
        output_text=f"wrote {secret} abc",
        locations=(ToolLocation(path=f"/tmp/{secret}/f", line=3),),
        diffs=(
            FileDiff(path=f"/tmp/{secret}/f", new_text="x" * (MAX_DIFF_SIDE_CHARS + 10)),
            FileDiff(path="/tmp/g", new_text=secret, old_text=f"old {secret}"),
        ),
    )
    prepared = prepared_tool(tool, redactor)
    assert secret not in repr(prepared)
    # The longer value is replaced whole, not as the shorter one plus a tail.
    assert prepared.raw_input == {"content": ["[relay:TOKEN]", {"[relay:TOKEN]": "[relay:LONGER]"}]}
    # A value under eight characters is left alone: it would only mangle ordinary text.
    assert prepared.output_text == "wrote [relay:TOKEN] abc"
    assert prepared.locations == (ToolLocation(path="/tmp/[relay:TOKEN]/f", line=3),)
    cut, whole = prepared.diffs
    assert cut.truncated
    assert cut.new_text.endswith(CUT_DIFF)
    assert len(cut.new_text) == MAX_DIFF_SIDE_CHARS
    assert not whole.truncated
    assert whole.new_text == "[relay:TOKEN]"
    assert whole.old_text == "old [relay:TOKEN]"
    # Without relay values the row passes unchanged.
    small = ToolState(name="t", status=ToolStatus.PENDING, title=secret)
    assert prepared_tool(small, RelayRedactor({})) is small
