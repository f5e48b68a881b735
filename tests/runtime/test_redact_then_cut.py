"""Relay values are redacted before any cut, and a cut never leaves the first 8 or more
characters of one: a real ``/bin/sh`` printing a value across the 64 KiB output limit leaves
no piece of it in the shell result, the tool row or the SQLite files."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtime_helpers import shell_row, store_bytes

from maple_acp._text import CUT_DIFF, CUT_TEXT
from maple_acp.model import FileDiff, ToolState, ToolStatus
from maple_acp.runtime import AgentService
from maple_acp.runtime._relay import MIN_REDACTED_CHARS, RelayRedactor
from maple_acp.runtime._tool_rows import MAX_DIFF_SIDE_CHARS, prepared_tool
from maple_acp.runtime._tools import MAX_SHELL_OUTPUT_BYTES

#: A 32-character relay value, as a token would be.
VALUE = secrets.token_hex(16)
PIECE = VALUE[:MIN_REDACTED_CHARS]


@pytest.mark.parametrize("before_cut", [MIN_REDACTED_CHARS, 9, 16, 24, len(VALUE) - 1])
async def test_a_relay_value_across_the_shell_output_cut_leaves_no_piece(
    service: AgentService, project: Path, tmp_path: Path, before_cut: int
) -> None:
    """``before_cut`` characters of the value fall before the 64 KiB cut, the rest after."""
    filler = MAX_SHELL_OUTPUT_BYTES - before_cut
    # Enough after the value that the output, redacted, is still over the limit.
    command = (
        f"head -c {filler} /dev/zero | tr '\\0' x; printf %s \"$MAPLE_TOKEN\"; "
        "head -c 100 /dev/zero | tr '\\0' y"
    )
    final = await shell_row(service, project, command, {"MAPLE_TOKEN": VALUE})
    output = final.raw_output["output"]
    assert final.raw_output["truncated"] is True
    assert output.startswith("x" * filler)
    assert len(output.encode()) <= MAX_SHELL_OUTPUT_BYTES
    assert PIECE not in json.dumps(final.raw_output)
    assert PIECE not in (final.output_text or "")
    assert PIECE.encode() not in store_bytes(tmp_path / "data")


@given(
    filler=st.integers(min_value=0, max_value=60),
    piece=st.integers(min_value=MIN_REDACTED_CHARS, max_value=len(VALUE) - 1),
    limit=st.integers(min_value=len(CUT_TEXT) + 1, max_value=120),
)
def test_a_cut_never_ends_in_a_piece_of_a_relay_value(filler: int, piece: int, limit: int) -> None:
    # The text holds a piece of the value (a backend's own cut, say) followed by other text.
    text = "x" * filler + VALUE[:piece] + "y" * 40 + VALUE + "z" * 200
    bounded, cut = RelayRedactor({"TOKEN": VALUE}).bounded(text, limit, CUT_TEXT)
    assert cut
    assert len(bounded) <= limit
    assert bounded.endswith(CUT_TEXT)
    kept = bounded[: -len(CUT_TEXT)]
    ends = [n for n in range(MIN_REDACTED_CHARS, len(VALUE) + 1) if kept.endswith(VALUE[:n])]
    assert not ends, f"the cut left {max(ends)} characters of the value"


def test_a_diff_cut_never_ends_in_a_piece_of_a_relay_value() -> None:
    keep = MAX_DIFF_SIDE_CHARS - len(CUT_DIFF)
    piece = VALUE[:20]
    text = "x" * (keep - len(piece)) + piece + "-not-the-rest-of-it" * 10
    tool = ToolState(
        name="write_file",
        status=ToolStatus.COMPLETED,
        title="write",
        diffs=(FileDiff(path="/p/f", new_text=text, old_text=text),),
    )
    [diff] = prepared_tool(tool, RelayRedactor({"TOKEN": VALUE})).diffs
    assert diff.truncated
    for side in (diff.new_text, diff.old_text):
        assert side is not None
        assert side.endswith(CUT_DIFF)
        assert PIECE not in side


def test_output_a_backend_cut_itself_never_ends_in_a_piece_of_a_relay_value() -> None:
    # A backend bounds its row text before the runtime sees it (a file read, say).
    read = "TOKEN=" + VALUE + "\nTOKEN_AGAIN=" + VALUE
    tool = ToolState(name="read_file", status=ToolStatus.COMPLETED, output_text=read[:-5])
    prepared = prepared_tool(tool, RelayRedactor({"TOKEN": VALUE}))
    assert prepared.output_text == "TOKEN=[relay:TOKEN]\nTOKEN_AGAIN="
