"""Notifications a peer sent without the params their method requires (a peer whose SDK now
leaves out ``params``): there is no answer to refuse them with, so they are ignored, and the
first of each method on a connection is logged, so a flood does not flood the log."""

from __future__ import annotations

import logging

from maple_acp._text import one_line

logger = logging.getLogger(__name__)

#: Characters of a method name a log line repeats.
MAX_LOGGED_METHOD_CHARS = 64


class MalformedNotifications:
    """One connection's malformed notifications: which methods were logged already."""

    def __init__(self) -> None:
        self._logged: set[str] = set()

    def ignore(self, method: str, reason: str) -> None:
        shown = one_line(method, MAX_LOGGED_METHOD_CHARS)
        if shown in self._logged:
            logger.debug("ignoring a malformed %s notification: %s", shown, reason)
            return
        self._logged.add(shown)
        logger.info(
            "ignoring a malformed %s notification (logged once per connection): %s", shown, reason
        )
