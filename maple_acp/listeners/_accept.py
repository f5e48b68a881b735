"""What every listener does when ``accept`` fails, and how it tells a trouble that repeats.

``accept`` failing with EMFILE, ENFILE, ENOMEM or ENOBUFS means "out of a resource for now"
(as trio's own ``serve_listeners`` judges it): the listener pauses and tries again, and tells
the log in one line at most once a minute with how many times it happened, never a traceback
per try. Any other failure is the listener's end and propagates. The Unix socket and the
network listener both accept through :class:`AcceptRetry`, so a flood on one is told the same
way as on the other.
"""

from __future__ import annotations

import errno
import logging
import math
import os
from collections.abc import Callable
from typing import Final

import trio

logger = logging.getLogger(__name__)

#: accept() failures that mean "out of a resource for now": pause and retry (as trio does).
TRANSIENT_ACCEPT_ERRNOS: Final = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
)
#: The pause after such a failure before the next try: short enough that a freed descriptor
#: is used at once, long enough not to spin.
ACCEPT_RETRY_S: Final = 0.1
#: A repeated trouble (accept failing, connections refused) is told at most once in this: a
#: flood must not flood the log too.
REPORT_WINDOW_S: Final = 60.0


class RepeatReport:
    """When to tell a trouble that repeats (sans-I/O): its first time, then at most once a
    window, with how many times it happened since it was last told."""

    def __init__(self, clock: Callable[[], float], window_s: float = REPORT_WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._told_at = -math.inf
        self._count = 0

    def note(self) -> int:
        """Count one; the count to tell now (this one included), or 0 to stay quiet."""
        self._count += 1
        now = self._clock()
        if now - self._told_at < self._window_s:
            return 0
        count, self._count, self._told_at = self._count, 0, now
        return count


class AcceptRetry:
    """Accepts on a listening socket through the failures that pass (see the module
    docstring); ``where`` names the listener in the log line (``"the Unix socket"``)."""

    def __init__(self, where: str, clock: Callable[[], float] = trio.current_time) -> None:
        self.where = where
        self._failures = RepeatReport(clock)

    async def accept(self, listener: trio.SocketListener) -> trio.SocketStream:
        """The next connection.

        Error handling: EMFILE/ENFILE/ENOMEM/ENOBUFS are retried every
        :data:`ACCEPT_RETRY_S` and told once a minute with a count; any other ``OSError``
        propagates.
        """
        while True:
            try:
                return await listener.accept()
            except OSError as exc:
                if exc.errno not in TRANSIENT_ACCEPT_ERRNOS:
                    raise
                self._tell(exc.errno)
            await trio.sleep(ACCEPT_RETRY_S)

    def _tell(self, code: int) -> None:
        count = self._failures.note()
        if count:
            logger.warning(
                "accept failed on %s (%s: %s) %d time%s in the last minute; retrying every %.1f s",
                self.where,
                errno.errorcode.get(code, code),
                os.strerror(code),
                count,
                "" if count == 1 else "s",
                ACCEPT_RETRY_S,
            )
