"""Fuzz target: the request id contract of the envelope parser, on ids of every JSON type and
size written in every legal spelling.

The input spells one request line: the first byte picks the id's JSON type (integer of any
length, a number with a fraction or an exponent, string, null, true/false, array, object, or
no id at all), the second byte where it goes and how it is spaced, the rest supplies its digits
or characters and the method name. Because the target writes the line itself, it knows the
answer the request id rules require (docs/protocol.md):

- an integer id, however large, comes back as exactly that integer (a JSON integer with the
  same digits in the answer, never a float, a string or a rounded value);
- a string or null id comes back unchanged; no id makes a notification;
- a number with a fraction or an exponent is ``-32600`` answered with ``id: null``, even one
  whose value overflows a double;
- a boolean, array or object id is ``-32600`` answered with ``id: null``;
- whatever the line, ``parse_message`` never raises and every error is one bounded line.

Run ``python fuzz/fuzz_envelopes.py -atheris_runs=N``; tests import :func:`fuzz_one` directly.
"""

from __future__ import annotations

import json
from typing import Any

from maple_acp.rpc import (
    ErrorResponse,
    InvalidMessage,
    Notification,
    Request,
    encode_error,
    encode_result,
    parse_message,
)
from maple_acp.wire import INVALID_REQUEST, MAX_ERROR_MESSAGE_CHARS, ProtocolError

#: Id spellings the first byte chooses between.
KINDS = ("integer", "fraction", "exponent", "string", "null", "boolean", "array", "object", "none")
#: Longest integer id the target spells: far beyond 64 bits, well inside one frame.
MAX_DIGITS = 400
_SPACES = ("", " ", "\t", "\r ", "  ")


def _digits(body: bytes, *, lead_zero_ok: bool = False) -> str:
    text = "".join(str(b % 10) for b in body[:MAX_DIGITS]) or "0"
    if not lead_zero_ok:
        # JSON forbids leading zeros in the integer part.
        text = text.lstrip("0") or "0"
    return text


def _id_token(kind: str, flags: int, body: bytes) -> tuple[str, Any]:
    """The id's JSON text and the value that must come back (``...`` = refused)."""
    sign = "-" if flags & 0x40 else ""
    if kind == "integer":
        text = sign + _digits(body)
        return text, int(text)
    if kind == "fraction":
        half = max(1, len(body) // 2)
        fraction = _digits(body[half:] or b"0", lead_zero_ok=True)
        return f"{sign}{_digits(body[:half])}.{fraction}", ...
    if kind == "exponent":
        exponent = str(int.from_bytes(body[:2] or b"\x00", "big") % 700)
        marker = "e" if flags & 0x80 else "E"
        esign = ("", "+", "-")[flags % 3]
        return f"{sign}{_digits(body[2:] or b'1')}{marker}{esign}{exponent}", ...
    if kind == "string":
        text = body.decode("utf-8", "replace")
        return json.dumps(text, ensure_ascii=bool(flags & 0x80)), text
    if kind == "null":
        return "null", None
    if kind == "boolean":
        return ("true" if flags & 1 else "false"), ...
    if kind == "array":
        return json.dumps([body.decode("utf-8", "replace")]), ...
    return json.dumps({"n": int.from_bytes(body[:8] or b"\x00", "big")}), ...


def _line(data: bytes) -> tuple[bytes, str, Any]:
    kind = KINDS[data[0] % len(KINDS)]
    flags = data[1] if len(data) > 1 else 0
    body = data[2:]
    split = body.find(b"\x00")
    method_bytes, id_bytes = (b"", body) if split < 0 else (body[:split], body[split + 1 :])
    method = method_bytes.decode("utf-8", "replace") or "session/prompt"
    space = _SPACES[flags % len(_SPACES)]
    members = [f'"jsonrpc":{space}"2.0"', f'"method":{json.dumps(method)}', '"params":{}']
    token, expected = ("", None) if kind == "none" else _id_token(kind, flags, id_bytes)
    if kind != "none":
        members.insert((flags >> 2) % (len(members) + 1), f'"id":{space}{token}{space}')
    return ("{" + ",".join(members) + "}").encode(), kind, expected


def _check_error(reply: ErrorResponse) -> None:
    assert reply.message
    assert "\n" not in reply.message
    assert len(reply.message) <= MAX_ERROR_MESSAGE_CHARS


def _echoed(msg_id: Any) -> Any:
    """The id as it appears in both our answer lines, read back by a reference parser."""
    ok = json.loads(encode_result(msg_id, {}))
    error = json.loads(encode_error(msg_id, ProtocolError(INVALID_REQUEST, "x")))
    assert ok["id"] == error["id"]
    assert type(ok["id"]) is type(error["id"])
    return ok["id"]


def fuzz_one(data: bytes) -> None:
    """Check the contract above on one spelled line. Raises AssertionError on a violation."""
    if not data:
        return
    line, kind, expected = _line(data)
    parsed = parse_message(line)
    if kind == "none":
        assert isinstance(parsed, Notification), (line, parsed)
        return
    if expected is ...:
        assert isinstance(parsed, InvalidMessage), (line, parsed)
        assert parsed.reply.code == INVALID_REQUEST, (line, parsed)
        assert parsed.reply.id is None, (line, parsed)
        _check_error(parsed.reply)
        assert json.loads(encode_error(parsed.reply.id, parsed.reply.to_exception()))["id"] is None
        return
    assert isinstance(parsed, Request), (line, parsed)
    echoed = _echoed(parsed.id)
    assert type(echoed) is type(expected), (line, echoed)
    assert echoed == expected, (line, echoed)
    if kind == "integer":
        # The very digits received (a leading minus on zero aside), not a re-rounded value.
        assert encode_result(parsed.id, {}).find(f'"id":{expected}'.encode()) >= 0


def main() -> None:
    from _atheris import run

    run("fuzz_envelopes", fuzz_one, ["maple_acp.rpc._envelope", "maple_acp.wire.errors", __name__])


if __name__ == "__main__":
    main()
