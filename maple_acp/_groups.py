"""The one exception inside Trio's exception groups.

A nursery wraps whatever its children raise in an ``ExceptionGroup``, often a group of one
inside a group of one. Callers that mean to handle one specific error (a ``ProtocolError`` a
handler raised in its own nursery, a backend's ``TurnFailed``) take it out with this helper
instead of each writing the same loop.
"""

from __future__ import annotations


def single_exception(exc: BaseException) -> BaseException:
    """``exc`` without its one-member group wrappers, at any depth. A group of several
    exceptions is returned as it is: there is no single one to take out."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
