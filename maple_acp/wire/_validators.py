"""The structuring error that names a field, and attrs validators shared by the wire types."""

from typing import Any

from maple_acp._exceptions import MapleAcpError

from ._naming import wire_key


class WireValueError(MapleAcpError, ValueError):
    """A value that does not fit its wire type.

    ``reason`` is safe to show to the peer (it never quotes more than a short tag); ``field`` is
    the wire key, below the current position, that the reason is about.
    """

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)


def non_negative(instance: Any, attribute: Any, value: Any) -> None:
    """Counts, sizes and line numbers are unsigned on the wire."""
    if value is not None and value < 0:
        raise WireValueError("expected a non-negative integer", field=wire_key(attribute.name))


def non_empty(instance: Any, attribute: Any, value: Any) -> None:
    """Texts the schema requires to be at least one character long."""
    if value is not None and not value:
        raise WireValueError("must not be empty", field=wire_key(attribute.name))
