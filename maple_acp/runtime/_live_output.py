"""A command's output while it runs: the bounded tail a caller is shown, and what was added
since the caller was last shown it (sans-I/O: the shell's reader feeds it, a publisher takes
snapshots of it at its own pace).

Memory is bounded whatever the command prints: the tail keeps a window of the last characters
and the part not yet taken is cut to the same window (a caller that took nothing for a while
is then told to replace what it shows with the tail, ``appended is None``)."""

from __future__ import annotations

import codecs
import signal
from typing import Final

import attrs

from maple_acp.runtime._relay import RelayRedactor

#: The tail a caller is shown: the tool-text limit every tool row's text meets.
LIVE_TAIL_CHARS: Final = 16_000
#: Raw characters kept behind the tail: a relay value replaced by a shorter marker, and a
#: value the window's start cuts through, still leave a whole tail to show.
_WINDOW_SLACK_CHARS: Final = LIVE_TAIL_CHARS


@attrs.frozen(kw_only=True)
class ShellOutput:
    """One snapshot of a command's output, redacted: the tail (the last ``LIVE_TAIL_CHARS``
    characters exactly, as a caller shows them) and the text added since the previous
    snapshot of the same tool call, or ``None`` when more came than the tail holds (the
    caller replaces what it shows with ``tail``). ``exited`` marks the last snapshot, with the
    exit code (``None`` when a signal ended the command: then ``signal`` names it)."""

    tool_id: str
    command: str
    cwd: str
    tail: str
    appended: str | None
    exited: bool = False
    exit_code: int | None = None
    signal: str | None = None

    def after(self, earlier: ShellOutput) -> ShellOutput:
        """This snapshot as one that replaces ``earlier`` unsent: what was added since the one
        before ``earlier`` (``None`` when the two together exceed the tail)."""
        if earlier.appended is None or self.appended is None:
            return attrs.evolve(self, appended=None)
        joined = earlier.appended + self.appended
        return attrs.evolve(self, appended=joined if len(joined) <= LIVE_TAIL_CHARS else None)


class OutputTail:
    """The output of one command as it comes: ``feed`` bytes, ``take`` snapshots."""

    __slots__ = ("_decoder", "_gap", "_pending", "_redactor", "_window", "_window_chars")

    def __init__(self, redactor: RelayRedactor) -> None:
        self._redactor = redactor
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._window_chars = LIVE_TAIL_CHARS + _WINDOW_SLACK_CHARS + redactor.longest_value_bytes
        self._window = ""
        self._pending = ""
        self._gap = False

    def feed(self, data: bytes | bytearray, *, final: bool = False) -> None:
        text = self._decoder.decode(data, final=final)
        if not text:
            return
        limit = self._window_chars
        window = self._window + text
        self._window = window[-limit:] if len(window) > limit else window
        pending = self._pending + text
        if len(pending) > limit:
            self._gap = True
            pending = pending[-limit:]
        self._pending = pending

    @property
    def changed(self) -> bool:
        """Something was fed since the last ``take``."""
        return bool(self._pending) or self._gap

    def take(self, *, final: bool = False) -> tuple[str, str | None]:
        """The tail and what was added since the last take (``None``: a gap). Before the end
        a trailing piece of a relay value is held back until the rest of it comes."""
        if final:
            self.feed(b"", final=True)
        redactor = self._redactor
        tail = redactor.text(self._window)
        pending = redactor.text(self._pending)
        held = 0
        if not final and redactor:
            safe = redactor.without_partial_value(pending)
            held = len(pending) - len(safe)
            pending = safe
            tail = tail[: len(tail) - held]
        appended: str | None = None if self._gap else pending
        self._pending = self._pending[len(self._pending) - held :] if held else ""
        self._gap = False
        return tail[-LIVE_TAIL_CHARS:], appended


def exit_line(exit_code: int | None) -> str:
    """How a command ended, in one line: ``exit code N`` or the signal that killed it."""
    if exit_code is None:
        return "ended"
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


def shell_row_text(line: str, tail: str) -> str:
    """A failed command's row text: ``line`` (its exit status, so a client that shows only
    the text still sees why), then as much of the tail's end as fits the tool-text limit."""
    room = LIVE_TAIL_CHARS - len(line) - 1
    return f"{line}\n{tail[-room:]}" if tail and room > 0 else line
