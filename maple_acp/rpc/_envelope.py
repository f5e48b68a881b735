"""JSON-RPC 2.0 envelopes: one line in, one message (or the error to answer) out. Sans-I/O.

Decisions this module makes for the whole connection:

- Batches (a top-level array) are refused with ``-32600`` unless the connection accepts them
  (ACP v2): then :func:`split_batch` turns one into its members, at most
  :data:`MAX_BATCH_MESSAGES`, each classified like a line of its own (a member that is an
  array is a malformed member, not a batch inside a batch).
- ``params`` must be an object or an array; ``null`` counts as absent. Anything else is
  ``-32600`` here. An array reaches the handler unchanged, so a handler that needs an object
  (every ACP method) refuses it with ``-32602``.
- A request id is a string, an integer or ``null`` (the ACP schema allows all three); a bool,
  a fractional number or a structure is ``-32600`` (even a fractional one beyond a double's
  range). An integer of any size is echoed exactly: one beyond 64 bits (even beyond a double's
  range) is re-read exactly and written back as the same digits.
- The error answer to a malformed *request* echoes its id when that id is valid. The answer to
  a malformed *response* always carries ``id: null``: echoing would hand the other side an id
  from our own id space, which it could mistake for one of its requests.
- A line is a response only if it says so: ``"jsonrpc": "2.0"``, or a ``result`` or ``error``
  member. An object with none of these and no ``method`` is a malformed request.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final, TypeAlias

import attrs
import orjson

from maple_acp.wire.errors import (
    INVALID_REQUEST,
    PARSE_ERROR,
    ProtocolError,
    bounded_message,
)

from ._error_object import error_object

RequestId: TypeAlias = int | str | None
Params: TypeAlias = dict[str, Any] | list[Any] | None

_ENCODE_OPTIONS: Final = orjson.OPT_APPEND_NEWLINE


@attrs.frozen
class Request:
    id: RequestId
    method: str
    params: Params = None


@attrs.frozen
class Notification:
    method: str
    params: Params = None


@attrs.frozen
class Response:
    id: RequestId
    result: Any


@attrs.frozen
class ErrorResponse:
    id: RequestId
    code: int
    message: str
    data: Any = None

    def to_exception(self) -> ProtocolError:
        return ProtocolError(self.code, self.message, self.data)


@attrs.frozen
class InvalidMessage:
    """A line that is not a usable message.

    ``reply`` is the error answer owed to the sender. ``response_id`` is set when the line
    looked like a response with a usable id, so the request waiting on that id can fail
    instead of waiting for an answer that will never come.
    """

    reply: ErrorResponse
    response_id: int | str | None = None


Message: TypeAlias = Request | Notification | Response | ErrorResponse
Parsed: TypeAlias = Message | InvalidMessage


#: The integers orjson reads and writes as integers; others need the exact path.
_MIN_INT: Final = -(2**63)
_MAX_INT: Final = 2**64 - 1


def _exact_id(line: bytes, value: object) -> object:
    """orjson reads an integer beyond 64 bits as a float. Such an id is re-read with the
    standard library, which keeps integers exact; a truly fractional id stays a float (and is
    refused). Only a float id pays for this."""
    if type(value) is not float:
        return value
    try:
        exact = json.loads(line).get("id")
    except Exception:  # anything orjson accepted but the stdlib does not: keep orjson's view
        return value
    return exact if type(exact) is int else value


#: orjson's refusal of a number beyond a double's range (an integer of 309 digits or more, or
#: a float such as ``1e400``).
_DOUBLE_OVERFLOW: Final = "number is infinity when parsed as double"


class _Overflow:
    """Stands for a number beyond a double's range while a refused line is re-read."""


_OVERFLOW: Final = _Overflow()


def _float_or_overflow(text: str) -> float | _Overflow:
    value = float(text)
    return value if math.isfinite(value) else _OVERFLOW


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _stdlib_read(line: bytes) -> Any:
    """``line`` read by the standard library, which keeps integers exact: a number beyond a
    double's range stands as :data:`_OVERFLOW`, and ``NaN``/``Infinity`` are refused, as
    orjson refuses them. ``None`` if it is not JSON at all."""
    try:
        return json.loads(line, parse_float=_float_or_overflow, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None


def _long_checked(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A message the standard library read, fit for the rest of the house; ``None`` if it
    holds what orjson would refuse anywhere but the id: a number beyond a double's range, a
    lone surrogate, or an integer beyond 64 bits (orjson could not write it back). An id
    beyond a double's range stands as ``inf``, so it is refused as any fractional id is."""
    if obj.get("id") is _OVERFLOW:
        obj["id"] = math.inf
    pending: list[Any] = [value for key, value in obj.items() if key != "id"]
    pending.extend(obj)
    while pending:
        value = pending.pop()
        if type(value) is str:
            try:
                value.encode()
            except UnicodeEncodeError:
                return None
        elif type(value) is int:
            if not _MIN_INT <= value <= _MAX_INT:
                return None
        elif type(value) is dict:
            pending.extend(value)
            pending.extend(value.values())
        elif type(value) is list:
            pending.extend(value)
        elif value is _OVERFLOW:
            return None
    return obj


def _reread_long_id(line: bytes) -> dict[str, Any] | None:
    """The message of a line orjson refused for a number beyond a double's range, when that
    number is the message's id, read by the standard library; else ``None`` (the parse error
    stands). An integer id is read exactly; a fractional one (``1e400``, or 400 digits with a
    point) stands as ``inf``, so it is refused as any fractional id is (``-32600``).
    Everything orjson would refuse elsewhere stays refused (see :func:`_long_checked`)."""
    obj = _stdlib_read(line)
    if type(obj) is not dict:
        return None
    if obj.get("id") is not _OVERFLOW and type(obj.get("id")) is not int:
        return None
    return _long_checked(obj)


def _id_json(msg_id: RequestId) -> Any:
    """An id as orjson can write it: an integer beyond 64 bits as its own digits."""
    if type(msg_id) is int and not _MIN_INT <= msg_id <= _MAX_INT:
        return orjson.Fragment(str(msg_id).encode())
    return msg_id


def _valid_id(value: object) -> bool:
    return value is None or isinstance(value, str) or (type(value) is int)


def _invalid(
    message: str, reply_id: RequestId = None, response_id: RequestId = None
) -> InvalidMessage:
    return InvalidMessage(
        ErrorResponse(reply_id, INVALID_REQUEST, bounded_message(message)), response_id
    )


#: Members of one batch: each counts as a frame, and a batch is one line, so the bound keeps a
#: single line from starting more work than a burst of lines the client would have to pace.
MAX_BATCH_MESSAGES: Final = 64


def split_batch(line: bytes) -> list[Parsed] | InvalidMessage | None:
    """A batch line's members, each classified as a line of its own would be; ``None`` if
    ``line`` is not a batch (a top-level array). An empty, oversized or unparseable batch is
    one ``InvalidMessage``: nothing of it runs. A member that is not a usable message is its
    own ``InvalidMessage``, answered in the batch's answer while the others run. Every
    member's integer id is exact, whatever its size. Never raises.

    orjson reads the batch (the fast path); only a batch it refuses for a number beyond a
    double's range, or one with a member whose id it read as a float (an integer beyond 64
    bits, or a fractional id), is read again by the standard library."""
    if line.lstrip()[:1] != b"[":
        return None
    exact = False
    try:
        members = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        members = _stdlib_read(line) if str(exc).startswith(_DOUBLE_OVERFLOW) else None
        if members is None:
            return InvalidMessage(
                ErrorResponse(None, PARSE_ERROR, bounded_message(f"parse error: {exc}"))
            )
        exact = True
    if type(members) is not list:
        return None
    if not members:
        return _invalid("invalid request: an empty batch")
    if len(members) > MAX_BATCH_MESSAGES:
        return _invalid(f"invalid request: a batch holds at most {MAX_BATCH_MESSAGES} messages")
    if not exact and any(type(m) is dict and type(m.get("id")) is float for m in members):
        reread = _stdlib_read(line)
        if type(reread) is list and len(reread) == len(members):
            for member, again in zip(members, reread, strict=True):
                if type(member) is dict and type(again) is dict and type(again.get("id")) is int:
                    member["id"] = again["id"]
    return [_batch_member(member, exact) for member in members]


def _batch_member(member: object, exact: bool) -> Parsed:
    if type(member) is not dict:
        return _classify(member)
    if exact:
        checked = _long_checked(member)
        if checked is None:
            msg_id = member.get("id")
            return _invalid(
                "invalid request: a number beyond 64 bits outside the id, or a lone surrogate",
                msg_id if _valid_id(msg_id) else None,
            )
        member = checked
    return _classify(member)


def parse_message(line: bytes) -> Parsed:
    """Classify one line. Never raises for any input."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        reread = _reread_long_id(line) if str(exc).startswith(_DOUBLE_OVERFLOW) else None
        if reread is None:
            return InvalidMessage(
                ErrorResponse(None, PARSE_ERROR, bounded_message(f"parse error: {exc}"))
            )
        obj = reread
    if type(obj) is dict and "id" in obj:
        obj["id"] = _exact_id(line, obj["id"])
    return _classify(obj)


def _classify(obj: object) -> Parsed:
    """Classify one message already read as JSON."""
    if type(obj) is not dict:
        if type(obj) is list:
            return _invalid("invalid request: batches are not supported")
        return _invalid("invalid request: a message must be a JSON object")
    if "method" in obj:
        return _parse_call(obj)
    return _parse_answer(obj)


def _parse_call(obj: dict[str, Any]) -> Parsed:
    has_id = "id" in obj
    msg_id = obj.get("id")
    id_ok = _valid_id(msg_id)
    reply_id = msg_id if has_id and id_ok else None
    if obj.get("jsonrpc") != "2.0":
        return _invalid('invalid request: "jsonrpc" must be "2.0"', reply_id)
    if not id_ok:
        return _invalid("invalid request: id must be a string, an integer or null")
    method = obj["method"]
    if type(method) is not str:
        return _invalid("invalid request: method must be a string", reply_id)
    params = obj.get("params")
    if params is not None and type(params) is not dict and type(params) is not list:
        return _invalid("invalid request: params must be an object or an array", reply_id)
    if has_id:
        return Request(msg_id, method, params)
    return Notification(method, params)


def _parse_answer(obj: dict[str, Any]) -> Parsed:
    msg_id = obj.get("id")
    usable_id = msg_id if (msg_id is not None and _valid_id(msg_id)) else None
    if obj.get("jsonrpc") != "2.0":
        if "result" not in obj and "error" not in obj:
            # Nothing marks it as an answer: it is a request missing its parts, and the
            # request waiting on that id (if any) is not its business.
            return _invalid('invalid request: "jsonrpc" must be "2.0"', usable_id)
        return _invalid('invalid response: "jsonrpc" must be "2.0"', None, usable_id)
    if "id" not in obj or not _valid_id(msg_id):
        return _invalid("invalid message: no method and no valid id", None, usable_id)
    has_result = "result" in obj
    has_error = "error" in obj
    if has_result == has_error:
        return _invalid(
            'invalid response: exactly one of "result" and "error" is required', None, usable_id
        )
    if has_result:
        if msg_id is None:
            return _invalid("invalid response: a result needs a non-null id")
        return Response(msg_id, obj["result"])
    error = obj["error"]
    if (
        type(error) is not dict
        or type(error.get("code")) is not int
        or type(error.get("message")) is not str
    ):
        return _invalid("invalid response: malformed error object", None, usable_id)
    return ErrorResponse(
        msg_id, error["code"], bounded_message(error["message"]), error.get("data")
    )


# --- encoding -----------------------------------------------------------------------------


def _checked(line: bytes) -> bytes:
    # orjson never emits a raw newline; pre-encoded fragments could.
    if line.find(b"\n") != len(line) - 1:
        raise ValueError("an outbound frame would contain a raw newline")
    return line


def encode_request(msg_id: RequestId, method: str, params: Any = None) -> bytes:
    """One request line, newline included. ``params`` may be an ``orjson.Fragment``."""
    obj: dict[str, Any] = {"jsonrpc": "2.0", "id": _id_json(msg_id), "method": method}
    if params is not None:
        obj["params"] = params
    return _checked(orjson.dumps(obj, option=_ENCODE_OPTIONS))


def encode_notification(method: str, params: Any = None) -> bytes:
    """One notification line, newline included. ``params`` may be an ``orjson.Fragment``."""
    if params is None:
        line = orjson.dumps({"jsonrpc": "2.0", "method": method}, option=_ENCODE_OPTIONS)
    else:
        line = orjson.dumps(
            {"jsonrpc": "2.0", "method": method, "params": params}, option=_ENCODE_OPTIONS
        )
    # The streaming hot path: the newline guard is inlined rather than a call.
    if line.find(b"\n") != len(line) - 1:
        raise ValueError("an outbound frame would contain a raw newline")
    return line


def encode_result(msg_id: RequestId, result: Any) -> bytes:
    return _checked(
        orjson.dumps(
            {"jsonrpc": "2.0", "id": _id_json(msg_id), "result": result}, option=_ENCODE_OPTIONS
        )
    )


def encode_error(msg_id: RequestId, error: ProtocolError) -> bytes:
    """An error answer of ours: its reason in ``data.details`` too (``_error_object``)."""
    return _error_line(msg_id, error_object(error))


def _error_line(msg_id: RequestId, error: dict[str, Any]) -> bytes:
    return _checked(
        orjson.dumps(
            {"jsonrpc": "2.0", "id": _id_json(msg_id), "error": error}, option=_ENCODE_OPTIONS
        )
    )


def encode_message(message: Message) -> bytes:
    """Encode any message class back to its line (tests, fuzzing, tools)."""
    if isinstance(message, Request):
        return encode_request(message.id, message.method, message.params)
    if isinstance(message, Notification):
        return encode_notification(message.method, message.params)
    if isinstance(message, Response):
        return encode_result(message.id, message.result)
    # Exactly as it was read: a round trip adds nothing to another side's error.
    return _error_line(message.id, message.to_exception().to_error_object())


def check_frame(line: bytes) -> bytes:
    """Check a pre-encoded line: exactly one newline, at its end. Returns it unchanged."""
    if not line:
        raise ValueError("an outbound frame must not be empty")
    return _checked(line)
