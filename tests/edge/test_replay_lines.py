"""A history replay builds its text lines from the pre-encoded template: byte for byte the
typed path's lines, with long messages split and other rows projected as before."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from maple_acp.edge._bounds import MAX_TOOL_TEXT_CHARS
from maple_acp.edge._projection import SessionProjector, encode_update, text_chunk
from maple_acp.model import ItemKind, TimelineItem, ToolState, ToolStatus
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
