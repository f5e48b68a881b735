"""Outbound admission: how much un-written output one connection may queue. Sans-I/O."""

from __future__ import annotations

from typing import Final

from ._exceptions import OutboundFrameTooLarge

#: Un-written lines one connection may queue (outbound admission, docs/protocol.md).
MAX_OUTBOUND_LINES: Final = 256
#: Un-written bytes one connection may queue, overhead included.
MAX_OUTBOUND_BYTES: Final = 4 * 1024 * 1024
#: Fixed cost added to each frame so that many tiny frames still count.
FRAME_OVERHEAD_BYTES: Final = 256
#: Un-written replies the reading side itself owes (a parse error, a refused request) that one
#: connection may queue: the reader never waits for credit, so they draw on a reserve of
#: their own, and a peer that keeps sending faults without reading the replies exhausts it.
REPLY_RESERVE_LINES: Final = 64
#: Bytes of that reserve, overhead included: 64 error replies of about 2 KiB each.
REPLY_RESERVE_BYTES: Final = 128 * 1024


class OutboundCredit:
    """Counts lines and bytes admitted but not yet fully written.

    A frame of ``n`` encoded bytes is charged ``n + 256`` bytes and one line. A charge is taken
    with :meth:`try_acquire` before the frame is queued and given back with :meth:`release` once
    the whole line has been written (or, for a frame that holds its credit, once its condition
    is over). A single frame whose charge exceeds the whole byte budget could never be
    admitted: :meth:`try_acquire` refuses it with :class:`OutboundFrameTooLarge`.
    """

    __slots__ = ("_bytes", "_lines", "max_bytes", "max_lines")

    def __init__(
        self, *, max_lines: int = MAX_OUTBOUND_LINES, max_bytes: int = MAX_OUTBOUND_BYTES
    ) -> None:
        if max_lines < 1 or max_bytes < 1:
            raise ValueError("outbound limits must be positive")
        if max_lines > MAX_OUTBOUND_LINES or max_bytes > MAX_OUTBOUND_BYTES:
            raise ValueError("outbound limits can only be lowered")
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._lines = 0
        self._bytes = 0

    @staticmethod
    def charge_for(encoded_size: int) -> int:
        """The byte charge of a frame of ``encoded_size`` bytes."""
        return encoded_size + FRAME_OVERHEAD_BYTES

    @property
    def lines_in_use(self) -> int:
        return self._lines

    @property
    def bytes_in_use(self) -> int:
        return self._bytes

    def check_admissible(self, charge: int) -> None:
        """Raise :class:`OutboundFrameTooLarge` if ``charge`` can never fit."""
        if charge > self.max_bytes:
            raise OutboundFrameTooLarge(
                f"outbound frame needs {charge} bytes of credit; the budget is {self.max_bytes}"
            )

    def try_acquire(self, charge: int) -> bool:
        """Take one line and ``charge`` bytes if both fit now; say whether it did."""
        if self._lines >= self.max_lines or self._bytes + charge > self.max_bytes:
            self.check_admissible(charge)
            return False
        self._lines += 1
        self._bytes += charge
        return True

    def try_acquire_many(self, lines: int, charge: int) -> bool:
        """Take ``lines`` lines and ``charge`` bytes in all if they fit now (a batch handed
        over at once); say whether it did. Nothing is taken when they do not all fit."""
        if self._lines + lines > self.max_lines or self._bytes + charge > self.max_bytes:
            return False
        self._lines += lines
        self._bytes += charge
        return True

    def release(self, charge: int, lines: int = 1) -> None:
        """Give back ``lines`` lines and ``charge`` bytes in all, taken by :meth:`try_acquire`.

        Releasing several at once lets a writer account for a whole batch in one call.
        """
        if lines < 1 or lines > self._lines or charge > self._bytes:
            raise RuntimeError("outbound credit released more than was acquired")
        self._lines -= lines
        self._bytes -= charge
