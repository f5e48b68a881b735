"""The error object of every error answer this side sends, in one place. Sans-I/O.

The reason is written twice: as JSON-RPC's ``message``, and as ``data.details``, because some
clients show an error's ``data.details`` and never its ``message`` (they would show a refusal
as a blank failure). ``data`` that is already an object keeps its keys and gains ``details``
beside them (a ``details`` of its own gives way: the rule holds for every answer); no ``data``
becomes ``{"details": message}``; ``data`` of another shape (none of ours) is kept whole under
``data.value``.
"""

from __future__ import annotations

from typing import Any, Final

from maple_acp.wire.errors import ProtocolError

#: The key of ``data`` that carries the error's one-line reason.
DETAILS_KEY: Final = "details"


def error_object(error: ProtocolError) -> dict[str, Any]:
    """``error`` as the ``error`` member of an answer line, its reason in ``data.details``."""
    data = error.data
    if data is None:
        details: dict[str, Any] = {DETAILS_KEY: error.message}
    elif isinstance(data, dict):
        details = {**data, DETAILS_KEY: error.message}
    else:
        details = {DETAILS_KEY: error.message, "value": data}
    return {"code": error.code, "message": error.message, "data": details}
