"""The one bounded-line rule every layer's messages go through."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from maple_acp._text import CUT_DIFF, CUT_LINE, CUT_TEXT, MAX_MESSAGE_CHARS, one_line, truncate
from maple_acp.mcp import McpDefinitionError
from maple_acp.runtime import bounded_text
from maple_acp.wire import bounded_message


@given(st.text(), st.integers(1, 600))
def test_always_one_bounded_non_empty_line(text: str, limit: int) -> None:
    line = one_line(text, limit)
    assert line
    assert len(line) <= limit
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in line)


def test_every_layer_applies_the_same_rule() -> None:
    text = "first\nsecond\r\x00\x85third " + "x" * 600
    expected = one_line(text)
    assert len(expected) == MAX_MESSAGE_CHARS
    assert expected.startswith("first second third x")
    assert bounded_message(text) == expected
    assert bounded_text(text) == expected
    assert McpDefinitionError(text).message == expected


@given(st.text(), st.integers(0, 80), st.sampled_from([CUT_LINE, CUT_TEXT, CUT_DIFF]))
def test_truncate_is_bounded_and_marks_every_cut(text: str, limit: int, marker: str) -> None:
    cut = truncate(text, limit, marker)
    assert len(cut) <= limit or cut == text
    if len(text) <= limit:
        assert cut == text
    else:
        assert len(cut) == limit
        if limit > len(marker):
            assert cut.endswith(marker)
            assert text.startswith(cut[: -len(marker)])


def test_each_purpose_has_its_own_marker() -> None:
    assert len({CUT_LINE, CUT_TEXT, CUT_DIFF}) == 3
    assert truncate("abcdefghij" * 3, 20, CUT_TEXT) == "abcdef" + CUT_TEXT
    assert truncate("short", 20, CUT_DIFF) == "short"
    assert one_line("y" * 30, 10) == "y" * 9 + CUT_LINE
