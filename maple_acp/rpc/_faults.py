"""The other side's faults, told to the operator: the first of each kind on a connection at
INFO, a flood of them at DEBUG, each in one bounded line. No I/O but the log."""

from __future__ import annotations

import logging
from typing import Final

logger = logging.getLogger(__name__)

#: A line about the other side's fault is cut to this (its own text may be long: one client
#: answers every update it does not know with 500 characters), so that with the log prefix it
#: stays within 200.
MAX_PEER_FAULT_CHARS: Final = 160
#: Kinds of fault told at INFO once each per connection; past this many, all go to DEBUG (a
#: client choosing error codes cannot grow the set).
MAX_PEER_FAULT_KINDS: Final = 16


class PeerFaults:
    """The kinds of the other side's faults already told at INFO on one connection."""

    __slots__ = ("_told",)

    def __init__(self) -> None:
        self._told: set[object] = set()

    def log(self, kind: object, text: str) -> None:
        """One line (at most ``MAX_PEER_FAULT_CHARS``) about the other side's fault: the first
        of each kind on this connection is worth an operator's attention (INFO); a flood of
        them is not (DEBUG)."""
        told = self._told
        first = kind not in told and len(told) < MAX_PEER_FAULT_KINDS
        if first:
            told.add(kind)
        line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
        if len(line) > MAX_PEER_FAULT_CHARS:
            line = line[: MAX_PEER_FAULT_CHARS - 1] + "…"
        logger.log(logging.INFO if first else logging.DEBUG, "%s", line)


def went_away(doing: str, exc: BaseException) -> str:
    """The close reason for a transport that failed under us while ``doing`` (reading or
    writing): the other side reset or closed its end. That is how a client quits, so the
    reason reads as one calm event; what the transport said is detail, kept at DEBUG."""
    logger.debug("the transport failed while %s: %r", doing, exc)
    return "the other side went away"
