"""Projection of runtime events to ``session/update``: the pre-encoded text line equals the
typed path byte for byte, and every update kind validates against the ACP schema."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from maple_acp.edge._bounds import MAX_TOOL_TEXT_CHARS
from maple_acp.edge._projection import (
    DIFF_TRUNCATED,
    SessionProjector,
    encode_update,
    text_chunk,
)
from maple_acp.model import (
    CommandInfo,
    FileDiff,
    PlanEntry,
    PlanPriority,
    PlanStatus,
    ToolLocation,
    ToolState,
    ToolStatus,
)
from maple_acp.testing import strategies as acp_st
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ChunkKind

KINDS: list[ChunkKind] = ["user_message_chunk", "agent_message_chunk", "agent_thought_chunk"]

TEXTS = {
    "ascii": "hello world",
    "unicode": "héllo wörld — 中文 — 😀🚀 — \u2028\u2029 — \ufeff",
    "control": "".join(chr(c) for c in range(32)) + "\x7f",
    "quotes": 'say "hi" \\ and \'bye\' \\"',
    "empty": "",
    "bound": "x" * MAX_TOOL_TEXT_CHARS,
    "bound-unicode": ("é😀" * MAX_TOOL_TEXT_CHARS)[:MAX_TOOL_TEXT_CHARS],
    "past-bound": "y" * (MAX_TOOL_TEXT_CHARS * 2 + 7),
}


def _typed_lines(session_id: str, kind: ChunkKind, message_id: str, text: str) -> list[bytes]:
    pieces = [
        text[i : i + MAX_TOOL_TEXT_CHARS] for i in range(0, len(text), MAX_TOOL_TEXT_CHARS)
    ] or [""]
    return [encode_update(text_chunk(session_id, kind, message_id, p)) for p in pieces]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_text_line_equals_the_typed_path(kind: ChunkKind, name: str) -> None:
    text = TEXTS[name]
    projector = SessionProjector("0123abcd")
    lines = projector.text(kind, "msg-1", text)
    assert lines == _typed_lines("0123abcd", kind, "msg-1", text)
    # The same message again reuses its template and still matches.
    assert projector.text(kind, "msg-1", text) == lines
    for line in lines:
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1


@given(session_id=acp_st.texts(), message_id=acp_st.texts(), text=acp_st.texts(max_size=300))
def test_text_line_equals_the_typed_path_for_any_ids(
    session_id: str, message_id: str, text: str
) -> None:
    projector = SessionProjector(session_id)
    for kind in KINDS:
        assert projector.text(kind, message_id, text) == _typed_lines(
            session_id, kind, message_id, text
        )


@pytest.mark.parametrize(
    ("session_id", "message_id"),
    [
        ("s\x00text\x00", "m"),
        ("s\x00id\x00", "m"),
        ("s", "\x00text\x00"),
        ("s", "\x00id\x00"),
        ("\x00id\x00\x00text\x00", "\x00text\x00\x00id\x00"),
    ],
)
def test_ids_that_hold_the_template_markers_still_match_the_typed_path(
    session_id: str, message_id: str
) -> None:
    projector = SessionProjector(session_id)
    for kind in KINDS:
        assert projector.text(kind, message_id, "hi") == _typed_lines(
            session_id, kind, message_id, "hi"
        )


def _params(item: Any) -> Any:
    line = item if isinstance(item, bytes) else encode_update(item)
    message = orjson.loads(line)
    assert message["method"] == "session/update"
    return message["params"]


def test_every_update_kind_validates(acp_schema: AcpSchema) -> None:
    projector = SessionProjector("s1")
    tool = ToolState(
        name="write_file",
        status=ToolStatus.COMPLETED,
        title="Write notes.md",
        raw_input={"path": "/p/notes.md"},
        output_text="wrote 3 lines",
        locations=(ToolLocation(path="/p/notes.md", line=3), ToolLocation(path="relative.md")),
        diffs=(
            FileDiff(path="/p/notes.md", new_text="a\nb\n", old_text="a\n"),
            FileDiff(path="/p/new.md", new_text="fresh"),
            FileDiff(path="/p/big.md", new_text="z" * 20, truncated=True),
        ),
    )
    first = _params(projector.tool("t1", tool))
    later = _params(projector.tool("t1", tool))
    assert first["update"]["sessionUpdate"] == "tool_call"
    assert later["update"]["sessionUpdate"] == "tool_call_update"
    assert first["update"]["locations"] == [{"path": "/p/notes.md", "line": 3}]
    diffs = [c for c in first["update"]["content"] if c["type"] == "diff"]
    assert diffs[0] == {
        "type": "diff",
        "path": "/p/notes.md",
        "oldText": "a\n",
        "newText": "a\nb\n",
    }
    # A new file's diff says so with an explicit null (Toad shows no diff without the key).
    assert diffs[1]["oldText"] is None
    assert diffs[2]["newText"].endswith(DIFF_TRUNCATED)
    plan = _params(
        projector.plan(
            [
                PlanEntry(content="read", status=PlanStatus.COMPLETED),
                PlanEntry(
                    content="write", priority=PlanPriority.HIGH, status=PlanStatus.IN_PROGRESS
                ),
            ]
        )
    )
    assert plan["update"] == {
        "sessionUpdate": "plan",
        "entries": [
            {"content": "read", "priority": "medium", "status": "completed"},
            {"content": "write", "priority": "high", "status": "in_progress"},
        ],
    }
    usage = _params(projector.context_usage(1200, 1000))
    assert usage["update"] == {"sessionUpdate": "usage_update", "used": 1200, "size": 1000}
    commands = _params(
        projector.commands(
            [
                CommandInfo(name="echo", description="Echo text", input_hint="TEXT"),
                CommandInfo(name="hang", description="Wait until cancelled"),
            ]
        )
    )
    assert commands["update"]["availableCommands"] == [
        {"name": "echo", "description": "Echo text", "input": {"hint": "TEXT"}},
        {"name": "hang", "description": "Wait until cancelled"},
    ]
    title = _params(projector.title("A title"))
    assert title["update"] == {"sessionUpdate": "session_info_update", "title": "A title"}
    for params in (first, later, plan, usage, commands, title, _params(projector.goal(None))):
        acp_schema.validate("SessionNotification", params)
    for line in projector.text("agent_thought_chunk", "m", TEXTS["unicode"]):
        acp_schema.validate("SessionNotification", _params(line))


@given(
    text=st.text(max_size=50),
    status=st.sampled_from(list(ToolStatus)),
    raw=st.none() | acp_st.json_objects(),
)
def test_any_tool_row_projects_to_a_valid_update(
    acp_schema: AcpSchema, text: str, status: ToolStatus, raw: Any
) -> None:
    projector = SessionProjector("s")
    tool = ToolState(name="shell", status=status, output_text=text, raw_input=raw, raw_output=raw)
    acp_schema.validate("SessionNotification", _params(projector.tool("t", tool)))
    acp_schema.validate("SessionNotification", _params(projector.tool("t", tool)))


def test_a_long_diff_is_bounded_like_other_tool_content_and_says_so(acp_schema: AcpSchema) -> None:
    projector = SessionProjector("s")
    big = "line\n" * 5000  # 25,000 characters
    tool = ToolState(
        name="edit_file",
        status=ToolStatus.COMPLETED,
        diffs=(FileDiff(path="/p/big.txt", new_text=big, old_text=big[:-5]),),
    )
    params = _params(projector.tool("t", tool))
    [diff] = params["update"]["content"]
    for key in ("newText", "oldText"):
        assert len(diff[key]) == MAX_TOOL_TEXT_CHARS
        assert diff[key].endswith(DIFF_TRUNCATED)
    acp_schema.validate("SessionNotification", params)


def test_interleaved_messages_and_kinds_each_keep_their_own_id() -> None:
    projector = SessionProjector("s1")
    sequence: list[tuple[ChunkKind, str, str]] = [
        ("agent_message_chunk", "m1", "a"),
        ("agent_message_chunk", "m1", "b"),
        ("agent_thought_chunk", "m1", "c"),
        ("agent_message_chunk", "m2", "d"),
        ("agent_message_chunk", "m1", "e" * (MAX_TOOL_TEXT_CHARS + 1)),
        ("agent_message_chunk", "m1", "f"),
        ("user_message_chunk", "m2", ""),
    ]
    for kind, message_id, text in sequence:
        assert projector.text(kind, message_id, text) == _typed_lines("s1", kind, message_id, text)
