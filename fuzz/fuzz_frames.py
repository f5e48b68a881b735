"""Fuzz target: the line framer and the envelope parser on arbitrary inbound bytes.

Run with atheris: ``python fuzz/fuzz_frames.py -atheris_runs=N``. The test suite imports
:func:`fuzz_one` and drives it with Hypothesis, so the target needs no atheris to be checked.

Invariants: chunking never changes the lines; no line is empty, too long or holds a newline;
parsing never raises; every error answer is a bounded single line on one frame; every valid
message re-encodes to one line that parses back to an equal message.
"""

from __future__ import annotations

import json

from maple_acp.rpc import (
    ErrorResponse,
    FrameTooLong,
    InvalidMessage,
    LineFramer,
    Notification,
    Request,
    Response,
    encode_error,
    encode_message,
    parse_message,
)
from maple_acp.wire.errors import INVALID_REQUEST, PARSE_ERROR

#: A small cap so that the fuzzer reaches the over-long path often.
FUZZ_LINE_CAP = 512


def _frame(data: bytes, chunk: int) -> list[bytes] | None:
    framer = LineFramer(max_line_bytes=FUZZ_LINE_CAP)
    lines: list[bytes] = []
    try:
        for start in range(0, len(data), chunk):
            lines.extend(framer.feed(data[start : start + chunk]))
    except FrameTooLong:
        return None
    last = framer.feed_eof()
    if last is not None:
        lines.append(last)
    return lines


def _check_single_line(line: bytes) -> None:
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1


def fuzz_one(data: bytes) -> None:
    """Check every invariant above on one input. Raises AssertionError on a violation."""
    if not data:
        return
    # 1 to 256 bytes per read: byte-wise splits stay reachable without making every input slow.
    chunk = data[0] + 1
    body = data[1:]
    whole = _frame(body, max(len(body), 1))
    assert _frame(body, chunk) == whole
    if whole is None:
        return
    for line in whole:
        assert line
        assert len(line) <= FUZZ_LINE_CAP
        assert b"\n" not in line
        assert not line.isspace()
        parsed = parse_message(line)
        if isinstance(parsed, InvalidMessage):
            reply = parsed.reply
            assert reply.code in (PARSE_ERROR, INVALID_REQUEST)
            # An answer echoes only an id it could read; whatever it is, it must encode.
            assert json.loads(encode_error(reply.id, reply.to_exception()))["id"] == reply.id
            assert reply.message
            assert "\n" not in reply.message
            assert len(reply.message) <= 500
            _check_single_line(encode_error(reply.id, reply.to_exception()))
            continue
        assert isinstance(parsed, Request | Notification | Response | ErrorResponse)
        encoded = encode_message(parsed)
        _check_single_line(encoded)
        assert parse_message(encoded[:-1]) == parsed


def main() -> None:
    from _atheris import run

    # Coverage guidance needs the code under test instrumented; it is imported already.
    modules = ["maple_acp.rpc._framing", "maple_acp.rpc._envelope"]
    # Twice the line cap reaches every path; longer inputs only slow the byte-wise framing.
    run("fuzz_frames", fuzz_one, modules, max_len=2 * FUZZ_LINE_CAP)


if __name__ == "__main__":
    main()
