"""A history replay builds its text lines from the pre-encoded template: byte for byte the
typed path's lines, with long messages split and other rows projected as before."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maple_acp.edge._bounds import MAX_TOOL_TEXT_CHARS
from maple_acp.edge._projection import SessionProjector, encode_update, text_chunk
from maple_acp.model import ItemKind, MessageRow, PlanEntry, TimelineItem, ToolState, ToolStatus
from maple_acp.testing import strategies as acp_st
from maple_acp.wire import ChunkKind

_CHUNK: dict[ItemKind, ChunkKind] = {
    ItemKind.USER: "user_message_chunk",
    ItemKind.ASSISTANT: "agent_message_chunk",
    ItemKind.THOUGHT: "agent_thought_chunk",
}


def _typed(session_id: str, item: TimelineItem) -> list[bytes]:
    text = item.text
    pieces = [text[i : i + MAX_TOOL_TEXT_CHARS] for i in range(0, len(text), MAX_TOOL_TEXT_CHARS)]
    return [
        encode_update(text_chunk(session_id, _CHUNK[item.kind], item.item_id, piece))
        for piece in pieces
    ]


@given(
    session_id=acp_st.texts(),
    rows=st.lists(
        st.tuples(st.sampled_from(list(_CHUNK)), acp_st.texts(), acp_st.texts(max_size=200)),
        max_size=8,
    ),
)
def test_replayed_text_rows_equal_the_typed_path(
    session_id: str, rows: list[tuple[ItemKind, str, str]]
) -> None:
    items = [
        TimelineItem(item_id=item_id, kind=kind, created_ms=1, text=text)
        for kind, item_id, text in rows
    ]
    expected = [line for item in items for line in _typed(session_id, item)]
    assert list(SessionProjector(session_id).history(items)) == expected


def test_a_long_message_and_other_rows_keep_their_place() -> None:
    long_text = "z" * (MAX_TOOL_TEXT_CHARS * 2 + 3)
    tool = ToolState(name="read_file", status=ToolStatus.COMPLETED, output_text="done")
    items = [
        TimelineItem(item_id="u1", kind=ItemKind.USER, created_ms=1, text="hi"),
        TimelineItem(item_id="t1", kind=ItemKind.TOOL, created_ms=1, text="done", tool=tool),
        TimelineItem(item_id="a1", kind=ItemKind.ASSISTANT, created_ms=1, text=long_text),
        TimelineItem(item_id="a2", kind=ItemKind.ASSISTANT, created_ms=1, text=""),
    ]
    lines = list(SessionProjector("s1").history(items))
    assert lines[0] == _typed("s1", items[0])[0]
    assert not isinstance(lines[1], bytes)  # the tool row goes the typed way
    assert lines[2:] == _typed("s1", items[2])
    assert len(lines) == 2 + 3


_TOOL = ToolState(name="read_file", status=ToolStatus.COMPLETED, output_text="done")
_OTHER_ROWS = [
    TimelineItem(item_id="t1", kind=ItemKind.TOOL, created_ms=1, text="done", tool=_TOOL),
    TimelineItem(item_id="p1", kind=ItemKind.PLAN, created_ms=1, plan=(PlanEntry(content="a"),)),
    TimelineItem(item_id="p2", kind=ItemKind.PLAN, created_ms=1, plan=(PlanEntry(content="b"),)),
]


@given(
    session_id=acp_st.texts(),
    rows=st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(list(_CHUNK)),
                acp_st.texts(),
                acp_st.texts(max_size=200) | st.just("y" * (MAX_TOOL_TEXT_CHARS + 1)),
            ),
            st.sampled_from(_OTHER_ROWS),
        ),
        max_size=10,
    ),
)
def test_message_rows_replay_as_their_items(
    session_id: str, rows: list[tuple[ItemKind, str, str] | TimelineItem]
) -> None:
    # A store may hand message rows out as MessageRow values: the lines are the ones the
    # whole items make, other rows (the latest plan only) in their places.
    items = [
        row
        if isinstance(row, TimelineItem)
        else TimelineItem(item_id=row[1], kind=row[0], created_ms=1, text=row[2])
        for row in rows
    ]
    tuples: list[TimelineItem | MessageRow] = [
        row if isinstance(row, TimelineItem) else MessageRow(row[0], row[1], row[2]) for row in rows
    ]
    expected = [
        line if isinstance(line, bytes) else encode_update(line)
        for line in SessionProjector(session_id).history(items)
    ]
    got = [
        line if isinstance(line, bytes) else encode_update(line)
        for line in SessionProjector(session_id).history(tuples)
    ]
    assert got == expected


def test_a_message_row_of_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="'tool'"):
        list(SessionProjector("s1").history([MessageRow(ItemKind.TOOL, "t1", "text")]))
