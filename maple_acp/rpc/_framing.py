"""Newline-delimited framing: bytes in, complete lines out. Sans-I/O."""

from __future__ import annotations

from typing import Final

from ._exceptions import FrameTooLong

#: Largest inbound line, terminator excluded (docs/protocol.md: one frame is at most 10 MiB).
MAX_LINE_BYTES: Final = 10 * 1024 * 1024

_NL: Final = 0x0A
_CR: Final = 0x0D


class LineFramer:
    """Splits a byte stream into lines.

    Lines end with ``\\n``; one ``\\r`` right before it is dropped, so ``\\r\\n`` works too.
    Lines that are empty or hold only ASCII whitespace are skipped. A line longer than
    ``max_line_bytes`` (not counting its terminator) raises :class:`FrameTooLong`, and so does
    every later call: the stream has lost its framing and the connection must end.

    At most ``max_line_bytes + 1`` bytes of an unfinished line are ever kept (the extra byte is
    a ``\\r`` that may turn out to be part of the terminator).
    """

    __slots__ = ("_broken", "_max", "_partial")

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if not 1 <= max_line_bytes <= MAX_LINE_BYTES:
            raise ValueError(f"max_line_bytes must be in 1..{MAX_LINE_BYTES}")
        self._max = max_line_bytes
        self._partial = bytearray()
        self._broken = False

    @property
    def max_line_bytes(self) -> int:
        return self._max

    @property
    def buffered(self) -> int:
        """Bytes of the unfinished line held so far."""
        return len(self._partial)

    def feed(self, data: bytes) -> list[bytes]:
        """Take the next chunk of the stream; return the lines it completed, in order."""
        if self._broken:
            raise FrameTooLong("the stream already exceeded the line cap")
        lines: list[bytes] = []
        nl = data.find(b"\n")
        if nl < 0:
            self._keep(data, 0)
            return lines
        start = 0
        if self._partial:
            # The held bytes never contain a newline, so only the new chunk is searched.
            self._check_length(len(self._partial) + nl, data[nl - 1] if nl else self._partial[-1])
            self._partial += data[:nl]
            self._emit(bytes(self._partial), lines)
            self._partial.clear()
            start = nl + 1
            nl = data.find(b"\n", start)
        while nl >= 0:
            self._check_length(nl - start, data[nl - 1] if nl > start else 0)
            self._emit(data[start:nl], lines)
            start = nl + 1
            nl = data.find(b"\n", start)
        self._keep(data, start)
        return lines

    def feed_eof(self) -> bytes | None:
        """The stream ended: return an unterminated last line, if one was pending.

        A peer that closes its side right after its last message without a newline is
        still heard.
        """
        if self._broken or not self._partial:
            return None
        lines: list[bytes] = []
        self._emit(bytes(self._partial), lines)
        self._partial.clear()
        return lines[0] if lines else None

    def _keep(self, data: bytes, start: int) -> None:
        tail = len(data) - start
        if not tail:
            return
        held = len(self._partial) + tail
        # One byte past the cap may be kept only if it is a '\r' that the next '\n' ends.
        if held > self._max + 1 or (held == self._max + 1 and data[-1] != _CR):
            self._fail(held)
        self._partial += data[start:] if start else data

    def _check_length(self, length: int, last_byte: int) -> None:
        if last_byte == _CR:
            length -= 1
        if length > self._max:
            self._fail(length)

    def _fail(self, length: int) -> None:
        self._broken = True
        self._partial = bytearray()
        raise FrameTooLong(f"inbound line exceeds {self._max} bytes (at least {length})")

    @staticmethod
    def _emit(line: bytes, lines: list[bytes]) -> None:
        if line and line[-1] == _CR:
            line = line[:-1]
        if line and not line.isspace():
            lines.append(line)
