"""A request's answer line from its handler's outcome, and a batch's one answer. Sans-I/O.

A handler's result or :class:`ProtocolError` becomes its answer line; anything else (or a
result orjson cannot encode) is ``-32603`` with a generic message, its traceback logged and
never sent. A JSON-RPC batch (ACP v2) is answered with one array: :class:`BatchAnswer`
collects its members' answers in member order.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from maple_acp._groups import single_exception
from maple_acp.wire.errors import INTERNAL_ERROR, ProtocolError

from ._envelope import Request, RequestId, encode_error, encode_result
from ._transport import Route

logger = logging.getLogger(__name__)


def unwrap_protocol_error(exc: BaseException) -> ProtocolError | None:
    """The :class:`ProtocolError` a handler raised, or ``None`` for any other failure."""
    # A handler that raises ProtocolError from inside its own nursery surfaces it wrapped in
    # an exception group; the answer should still carry that error.
    exc = single_exception(exc)
    return exc if isinstance(exc, ProtocolError) else None


def internal_error(method: str, exc: BaseException) -> ProtocolError:
    """The answer to a handler's failure that is not a :class:`ProtocolError` (logged with
    its traceback; the wire gets only the exception's type)."""
    logger.error("request handler for %r failed", method, exc_info=exc)
    return ProtocolError(INTERNAL_ERROR, f"internal error ({type(exc).__name__})")


def encode_answer(request: Request, result: Any, error: ProtocolError | None) -> bytes:
    """The answer line of ``request``: its result, or ``error``."""
    if error is None:
        try:
            return encode_result(request.id, result)
        except (TypeError, ValueError) as exc:
            error = internal_error(request.method, exc)
    try:
        return encode_error(request.id, error)
    except (TypeError, ValueError) as exc:
        # The handler put something orjson cannot encode into the error's data.
        logger.error("error answer to %r not encodable: %r", request.method, exc)
        return encode_error(request.id, ProtocolError(error.code, error.message))


class BatchAnswer:
    """The one answer of a JSON-RPC batch: an answer per request member (and per malformed
    member), in member order, sent as one array once the batch is read whole (``sealed``)
    and every slot is filled. A batch of notifications and answers only is answered with
    nothing at all (JSON-RPC 2.0, section 6)."""

    __slots__ = ("handled", "ids", "lines", "missing", "route", "sealed", "sent")

    def __init__(self, route: Route = None) -> None:
        #: The route of the batch's message: its answer goes back the same way.
        self.route = route
        self.ids: list[RequestId] = []
        self.lines: list[bytes] = []
        self.missing = 0
        self.sealed = False
        #: Whether a handler's answer is in it (else only the reader's refusals are).
        self.handled = False
        #: Set once the array is queued (or never will be): members' follow-ups wait for it.
        self.sent = trio.Event()

    def slot(self, msg_id: RequestId) -> int:
        self.ids.append(msg_id)
        self.lines.append(b"")
        self.missing += 1
        return len(self.lines) - 1

    def fill(self, index: int, line: bytes) -> bool:
        """Put one member's answer line in; True if that completed a sealed batch."""
        self.lines[index] = line
        self.missing -= 1
        return self.complete

    @property
    def complete(self) -> bool:
        return self.sealed and self.missing == 0 and bool(self.lines)

    def encode(self) -> bytes:
        # Each answer is one line ending in its newline: the array joins them without it.
        return b"[" + b",".join(line[:-1] for line in self.lines) + b"]\n"

    def shrink(self, error: ProtocolError) -> bool:
        """Replace the largest answer still larger than ``error`` would be by it; False if
        none is left."""
        replacements = [encode_error(msg_id, error) for msg_id in self.ids]
        larger = [i for i, line in enumerate(self.lines) if len(line) > len(replacements[i])]
        if not larger:
            return False
        largest = max(larger, key=lambda i: len(self.lines[i]))
        self.lines[largest] = replacements[largest]
        return True
