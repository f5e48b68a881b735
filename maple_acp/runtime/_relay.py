"""Relay values: credentials a local connector hands over for the host's shell-like tools.

They are checked once, here (the host's allow-list, the size limits, no NUL), live only in a
lease's in-memory tool context, and never reach the store, a log or a client: every tool row is
passed through ``RelayRedactor`` before it is stored or sent.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from maple_acp._text import truncate
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection

#: Relay values are credentials handed over by a local connector; these bounds keep one
#: connection from parking unbounded data in the host's memory and children's environments.
MAX_RELAY_VALUES = 16
#: Per value, in UTF-8 bytes.
MAX_RELAY_VALUE_BYTES = 16 * 1024
#: All values together, in UTF-8 bytes.
MAX_RELAY_TOTAL_BYTES = 32 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def validate_relay_values(values: Mapping[str, str], allowed: Collection[str]) -> dict[str, str]:
    """Check relay values against the host's allow-list and the limits; returns a private copy.
    Raises ``RuntimeRejection(INVALID_RELAY)``; the message names a variable, never a value."""

    def reject(message: str) -> RuntimeRejection:
        return RuntimeRejection(RejectionKind.INVALID_RELAY, message)

    if len(values) > MAX_RELAY_VALUES:
        raise reject(f"at most {MAX_RELAY_VALUES} relay values are accepted")
    total = 0
    checked: dict[str, str] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise reject("a relay value has an invalid name")
        if name not in allowed:
            raise reject(f"relay value {name} is not allowed by the host")
        if not isinstance(value, str) or "\x00" in value:
            raise reject(f"relay value {name} is not a string without NUL")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_RELAY_VALUE_BYTES:
            raise reject(f"relay value {name} exceeds {MAX_RELAY_VALUE_BYTES} bytes")
        total += size
        checked[name] = value
    if total > MAX_RELAY_TOTAL_BYTES:
        raise reject(f"relay values exceed {MAX_RELAY_TOTAL_BYTES} bytes in all")
    return checked


class RelayValues(Mapping[str, str]):
    """Relay values the runtime has already checked; a lease takes them without checking
    again. Made by ``AgentService.accept_relay``. Its ``repr`` names variables, never values."""

    __slots__ = ("_values", "dropped")

    def __init__(self, checked: Mapping[str, str], *, dropped: int = 0) -> None:
        self._values = dict(checked)
        #: Offered names the host's allow-list does not include (they were left out).
        self.dropped = dropped

    @classmethod
    def accept(cls, offered: Mapping[str, str], allowed: Collection[str]) -> RelayValues:
        """Keep the offered names the host allows (a connector may offer more), then check
        them. Raises ``INVALID_RELAY``."""
        if not isinstance(offered, Mapping):
            raise RuntimeRejection(RejectionKind.INVALID_RELAY, "relay values must be a mapping")
        kept = {name: value for name, value in offered.items() if name in allowed}
        return cls(validate_relay_values(kept, allowed), dropped=len(offered) - len(kept))

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"RelayValues(names={sorted(self._values)!r})"


#: Relay values shorter than this are not redacted: a short value (``1``, ``yes``) would turn
#: ordinary text into markers and hide nothing worth hiding.
MIN_REDACTED_CHARS = 8


class RelayRedactor:
    """Replaces every occurrence of a relay value of at least ``MIN_REDACTED_CHARS``
    characters with ``[relay:NAME]``. Longer values are replaced first, so a value that
    contains another is replaced whole.

    Text is redacted before it is cut (``bounded``), never after: a cut through a value would
    leave a piece that no longer matches it. And what a cut keeps never ends with the first
    ``MIN_REDACTED_CHARS`` or more characters of a value (``without_partial_value``)."""

    __slots__ = ("_pairs",)

    def __init__(self, values: Mapping[str, str]) -> None:
        pairs = [(value, f"[relay:{name}]") for name, value in values.items()]
        pairs = [pair for pair in pairs if len(pair[0]) >= MIN_REDACTED_CHARS]
        self._pairs = sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)

    def __bool__(self) -> bool:
        return bool(self._pairs)

    @property
    def longest_value_bytes(self) -> int:
        """The UTF-8 size of the longest value redacted: how far past a cut a reader must
        look to redact a value the cut goes through."""
        return max(
            (len(value.encode("utf-8", "surrogatepass")) for value, _ in self._pairs), default=0
        )

    def text(self, text: str) -> str:
        for value, marker in self._pairs:
            if value in text:
                text = text.replace(value, marker)
        return text

    def without_partial_value(self, text: str) -> str:
        """``text`` without a trailing start of a relay value (``MIN_REDACTED_CHARS`` or more
        of its characters): what a cut through the value would otherwise leave."""
        trimmed = True
        while trimmed:
            trimmed = False
            for value, _ in self._pairs:
                head = value[:MIN_REDACTED_CHARS]
                # Only a start that runs to the end of the text can be a cut value's piece.
                at = text.find(head, max(0, len(text) - len(value)))
                while at != -1:
                    if value.startswith(text[at:]):
                        text, trimmed = text[:at], True
                        break
                    at = text.find(head, at + 1)
        return text

    def bounded(self, text: str, limit: int, marker: str) -> tuple[str, bool]:
        """``text`` redacted, then cut to ``limit`` characters ending with ``marker`` (see
        ``maple_acp._text.truncate``) with no piece of a value left before the marker; and
        whether it was cut."""
        redacted = self.text(text)
        if len(redacted) <= limit:
            return redacted, False
        return truncate(redacted, limit, marker, trim=self.without_partial_value), True

    def value(self, value: Any) -> Any:
        """A JSON-ready value with every string in it (keys too) redacted."""
        if not self._pairs:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.value(key): self.value(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        return value

    def clear(self) -> None:
        self._pairs = []
