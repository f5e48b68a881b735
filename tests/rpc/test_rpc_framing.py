"""The line framer: terminators, empty lines, chunk boundaries and the line cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maple_acp.rpc import MAX_LINE_BYTES, FrameTooLong, LineFramer


def feed_all(framer: LineFramer, chunks: list[bytes]) -> list[bytes]:
    lines: list[bytes] = []
    for chunk in chunks:
        lines.extend(framer.feed(chunk))
    return lines


def test_splits_on_newline_and_keeps_the_unfinished_tail() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert framer.buffered == 4
    assert framer.feed(b":3}\n") == [b'{"c":3}']
    assert framer.buffered == 0


def test_crlf_is_one_terminator_and_a_lone_cr_inside_a_line_stays() -> None:
    framer = LineFramer()
    assert framer.feed(b"one\r\ntwo\n a\rb \r\n") == [b"one", b"two", b" a\rb "]


def test_empty_and_whitespace_only_lines_are_skipped() -> None:
    framer = LineFramer()
    assert framer.feed(b"\n\r\n  \t\n\r\nx\n\n") == [b"x"]


@pytest.mark.parametrize("cut", range(1, len(b'{"k":1}\r\n{"k":2}\r\n')))
def test_a_chunk_boundary_anywhere_gives_the_same_lines(cut: int) -> None:
    data = b'{"k":1}\r\n{"k":2}\r\n'
    assert feed_all(LineFramer(), [data[:cut], data[cut:]]) == [b'{"k":1}', b'{"k":2}']


def test_split_inside_crlf_byte_by_byte() -> None:
    framer = LineFramer()
    lines = feed_all(framer, [bytes([b]) for b in b"ab\r\ncd\r\n"])
    assert lines == [b"ab", b"cd"]


def test_a_line_of_exactly_the_cap_is_accepted_with_either_terminator() -> None:
    for terminator in (b"\n", b"\r\n"):
        framer = LineFramer(max_line_bytes=16)
        line = b"x" * 16
        # Once whole in one chunk, once with the terminator arriving in a later chunk.
        assert framer.feed(line + terminator) == [line]
        assert framer.feed(line) == []
        assert framer.feed(terminator[:1]) == ([line] if terminator == b"\n" else [])
        if terminator == b"\r\n":
            assert framer.feed(b"\n") == [line]


@pytest.mark.parametrize(
    "chunks",
    [
        [b"x" * 17 + b"\n"],
        [b"x" * 17],
        [b"x" * 10, b"x" * 7],
        [b"x" * 16, b"y"],
        [b"x" * 16 + b"\r", b"y"],
        [b"x" * 10, b"x" * 7 + b"\r\n"],
        [b"ok\n" + b"x" * 17 + b"\r\n"],
    ],
)
def test_cap_plus_one_is_refused_and_the_framer_stays_broken(chunks: list[bytes]) -> None:
    framer = LineFramer(max_line_bytes=16)
    with pytest.raises(FrameTooLong):
        feed_all(framer, chunks)
    assert framer.buffered == 0
    with pytest.raises(FrameTooLong):
        framer.feed(b"{}\n")


def test_never_holds_more_than_the_cap_plus_a_possible_cr() -> None:
    framer = LineFramer(max_line_bytes=8)
    framer.feed(b"x" * 8 + b"\r")
    assert framer.buffered == 9
    assert framer.feed(b"\n") == [b"x" * 8]


def test_cap_is_configurable_only_downwards() -> None:
    assert LineFramer().max_line_bytes == MAX_LINE_BYTES == 10 * 1024 * 1024
    with pytest.raises(ValueError, match="max_line_bytes"):
        LineFramer(max_line_bytes=MAX_LINE_BYTES + 1)
    with pytest.raises(ValueError, match="max_line_bytes"):
        LineFramer(max_line_bytes=0)


def test_full_size_cap_accepts_a_ten_mebibyte_line_and_refuses_one_more_byte() -> None:
    line = b"a" * MAX_LINE_BYTES
    assert LineFramer().feed(line + b"\n") == [line]
    with pytest.raises(FrameTooLong):
        LineFramer().feed(line + b"a")


def test_eof_hands_out_an_unterminated_last_line() -> None:
    framer = LineFramer()
    assert framer.feed(b"a\nlast") == [b"a"]
    assert framer.feed_eof() == b"last"
    assert framer.feed_eof() is None
    spaces = LineFramer()
    spaces.feed(b"  \r")
    assert spaces.feed_eof() is None


@given(
    lines=st.lists(
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), min_size=0, max_size=12
    ),
    crlf=st.lists(st.booleans(), min_size=12, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=20),
)
def test_any_chunking_gives_the_same_lines(
    lines: list[bytes], crlf: list[bool], cuts: list[int]
) -> None:
    data = b"".join(
        line + (b"\r\n" if use_crlf else b"\n") for line, use_crlf in zip(lines, crlf, strict=False)
    )
    whole = LineFramer(max_line_bytes=64).feed(data)
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert feed_all(LineFramer(max_line_bytes=64), chunks) == whole
    expected = []
    for line, use_crlf in zip(lines, crlf, strict=False):
        # Only one '\r' before the '\n' belongs to the terminator.
        body = line[:-1] if not use_crlf and line.endswith(b"\r") else line
        if body and not body.isspace():
            expected.append(body)
    assert whole == expected
