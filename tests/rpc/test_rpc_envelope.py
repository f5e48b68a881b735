"""Envelope parsing and encoding: every malformed class gets its precise error answer."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from maple_acp.rpc import (
    ErrorResponse,
    InvalidMessage,
    Notification,
    Request,
    Response,
    check_frame,
    encode_error,
    encode_message,
    encode_notification,
    encode_request,
    encode_result,
    parse_message,
)
from maple_acp.wire.errors import INVALID_REQUEST, PARSE_ERROR, ProtocolError


def invalid(line: bytes) -> InvalidMessage:
    parsed = parse_message(line)
    assert isinstance(parsed, InvalidMessage), parsed
    message = parsed.reply.message
    assert message
    assert "\n" not in message
    assert len(message) <= 500
    return parsed


@pytest.mark.parametrize(
    "line",
    [b"{", b"not json", b'{"a":1,}', b"\xff\xfe", b'{"jsonrpc":"2.0"', b"[" * 2000 + b"]" * 2000],
)
def test_bad_json_is_a_parse_error_with_null_id(line: bytes) -> None:
    parsed = invalid(line)
    assert parsed.reply.code == PARSE_ERROR
    assert parsed.reply.id is None


@pytest.mark.parametrize(
    ("line", "reply_id"),
    [
        (b"[]", None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"m"}]', None),
        (b"1", None),
        (b'"text"', None),
        (b"null", None),
        (b'{"id":1,"method":"m"}', 1),
        (b'{"jsonrpc":"1.0","id":"a","method":"m"}', "a"),
        (b'{"jsonrpc":2.0,"id":1,"method":"m"}', 1),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"m"}', None),
        (b'{"jsonrpc":"2.0","id":true,"method":"m"}', None),
        (b'{"jsonrpc":"2.0","id":{"x":1},"method":"m"}', None),
        (b'{"jsonrpc":"2.0","id":[1],"method":"m"}', None),
        (b'{"jsonrpc":"2.0","id":7,"method":7}', 7),
        (b'{"jsonrpc":"2.0","id":7,"method":null}', 7),
        (b'{"jsonrpc":"2.0","id":7,"method":"m","params":"s"}', 7),
        (b'{"jsonrpc":"2.0","id":7,"method":"m","params":3}', 7),
        (b'{"jsonrpc":"2.0","method":"m","params":true}', None),
        (b"{}", None),
        (b'{"jsonrpc":"2.0"}', None),
    ],
)
def test_invalid_requests_get_minus_32600_echoing_a_valid_id(line: bytes, reply_id: object) -> None:
    parsed = invalid(line)
    assert parsed.reply.code == INVALID_REQUEST
    assert parsed.reply.id == reply_id
    assert type(parsed.reply.id) is type(reply_id)


@pytest.mark.parametrize(
    ("line", "response_id"),
    [
        (b'{"jsonrpc":"2.0","id":3}', 3),
        (b'{"jsonrpc":"2.0","id":3,"result":1,"error":{"code":1,"message":"m"}}', 3),
        (b'{"jsonrpc":"2.0","id":3,"error":"boom"}', 3),
        (b'{"jsonrpc":"2.0","id":3,"error":{"code":"x","message":"m"}}', 3),
        (b'{"jsonrpc":"2.0","id":3,"error":{"code":1}}', 3),
        (b'{"jsonrpc":"2.0","id":3,"error":{"code":true,"message":"m"}}', 3),
        (b'{"id":"r","result":1}', "r"),
        (b'{"jsonrpc":"2.0","id":null,"result":1}', None),
        (b'{"jsonrpc":"2.0","id":1.0,"result":1}', None),
    ],
)
def test_malformed_responses_are_answered_with_null_id_and_name_the_id_to_fail(
    line: bytes, response_id: object
) -> None:
    parsed = invalid(line)
    assert parsed.reply.code == INVALID_REQUEST
    assert parsed.reply.id is None
    assert parsed.response_id == response_id


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"m"}', Request(1, "m", None)),
        (b'{"jsonrpc":"2.0","id":"x","method":"m","params":{"a":1}}', Request("x", "m", {"a": 1})),
        (b'{"jsonrpc":"2.0","id":null,"method":"m","params":[1]}', Request(None, "m", [1])),
        (b'{"jsonrpc":"2.0","id":2,"method":"m","params":null}', Request(2, "m", None)),
        (b'{"jsonrpc":"2.0","method":"n","extra":1}', Notification("n", None)),
        (b'{"jsonrpc":"2.0","id":1,"result":null}', Response(1, None)),
        (b'{"jsonrpc":"2.0","id":"s","result":{"k":[1]}}', Response("s", {"k": [1]})),
        (
            b'{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"no","data":{"d":1}}}',
            ErrorResponse(4, -32601, "no", {"d": 1}),
        ),
        (
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}',
            ErrorResponse(None, -32700, "bad", None),
        ),
    ],
)
def test_valid_messages(line: bytes, expected: object) -> None:
    assert parse_message(line) == expected


def test_a_received_error_message_is_bounded_to_one_line() -> None:
    line = orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "a\nb" + "c" * 900}}
    )
    parsed = parse_message(line)
    assert isinstance(parsed, ErrorResponse)
    assert "\n" not in parsed.message
    assert len(parsed.message) == 500
    exc = parsed.to_exception()
    assert (exc.code, exc.message) == (1, parsed.message)


@pytest.mark.parametrize(
    "message",
    [
        Request(1, "session/new", {"cwd": "/tmp"}),
        Request("id-1", "m", [1, 2]),
        Request(None, "m", None),
        Notification("session/update", {"text": "line\nbreak"}),
        Response(9, None),
        Response(9, {"a": "\r\n"}),
        ErrorResponse(3, -32602, "bad params", {"field": "cwd"}),
        ErrorResponse(None, -32700, "parse error", None),
    ],
)
def test_encode_then_parse_round_trips_on_one_line(message: Any) -> None:
    line = encode_message(message)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert parse_message(line[:-1]) == message


def test_encoders_omit_absent_params_and_keep_result_null() -> None:
    assert orjson.loads(encode_notification("m")) == {"jsonrpc": "2.0", "method": "m"}
    assert orjson.loads(encode_request(1, "m")) == {"jsonrpc": "2.0", "id": 1, "method": "m"}
    assert orjson.loads(encode_result(1, None)) == {"jsonrpc": "2.0", "id": 1, "result": None}
    assert orjson.loads(encode_error(None, ProtocolError(-32600, "x"))) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "x", "data": {"details": "x"}},
    }


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, {"details": "refused"}),
        ({"sessionId": "s"}, {"sessionId": "s", "details": "refused"}),
        ({"details": "another", "n": 1}, {"details": "refused", "n": 1}),
        ([1, 2], {"details": "refused", "value": [1, 2]}),
    ],
)
def test_our_error_answers_carry_the_reason_in_data_details(data: Any, expected: Any) -> None:
    error = ProtocolError(-32602, "refused", data)
    assert orjson.loads(encode_error(3, error))["error"] == {
        "code": -32602,
        "message": "refused",
        "data": expected,
    }
    # The error itself is left as it was.
    assert error.data == data


def test_an_error_read_from_the_other_side_is_encoded_back_as_it_came() -> None:
    line = b'{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"no"}}'
    assert orjson.loads(encode_message(parse_message(line))) == orjson.loads(line)


def test_pre_encoded_params_are_embedded_and_a_raw_newline_is_refused() -> None:
    line = encode_notification("m", orjson.Fragment(b'{"a":[1,2]}'))
    assert line == b'{"jsonrpc":"2.0","method":"m","params":{"a":[1,2]}}\n'
    with pytest.raises(ValueError, match="newline"):
        encode_notification("m", orjson.Fragment(b'{"a":\n1}'))


@pytest.mark.parametrize("line", [b"", b"{}", b"{}\n{}\n", b"{\n}\n"])
def test_check_frame_refuses_anything_but_one_terminated_line(line: bytes) -> None:
    with pytest.raises(ValueError, match="frame"):
        check_frame(line)
    assert check_frame(b"{}\n") == b"{}\n"


@pytest.mark.parametrize(
    "text",
    [
        "18446744073709551616",
        "18446744073709551615",
        "-9223372036854775809",
        "123456789012345678901234567890123456789",
        "9" * 400,  # beyond a double's range: orjson refuses the line, the exact re-read keeps it
        "-" + "7" * 1000,
    ],
)
def test_an_integer_id_of_any_size_is_echoed_with_its_exact_digits(text: str) -> None:
    line = b'{"jsonrpc":"2.0","id":' + text.encode() + b',"method":"m","params":{}}'
    parsed = parse_message(line)
    assert isinstance(parsed, Request)
    assert parsed.id == int(text)
    assert type(parsed.id) is int
    answer = encode_result(parsed.id, {})
    assert answer == b'{"jsonrpc":"2.0","id":' + text.encode() + b',"result":{}}\n'
    error = encode_error(parsed.id, ProtocolError(-32601, "nope"))
    assert b'"id":' + text.encode() + b"," in error


@pytest.mark.parametrize(
    "line",
    [
        # The exact re-read of a long id refuses what orjson refuses everywhere else.
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":1e400}}',
        b'{"jsonrpc":"2.0","id":1e400,"method":"m","params":{"x":1e400}}',
        b'{"jsonrpc":"2.0","id":' + b"9" * 400 + b',"method":"m","params":{"x":1e400}}',
        b'{"jsonrpc":"2.0","id":' + b"9" * 400 + b',"method":"m","params":{"x":NaN}}',
        b'{"jsonrpc":"2.0","id":' + b"9" * 400 + b',"method":"m","params":{"x":"\\ud800"}}',
        b'{"jsonrpc":"2.0","id":'
        + b"9" * 400
        + b',"method":"m","params":{"n":'
        + b"8" * 30
        + b"}}",
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"n":' + b"8" * 400 + b"}}",
        b"[" + b"9" * 400 + b"]",
    ],
)
def test_a_number_beyond_a_double_is_a_parse_error_except_as_the_id(line: bytes) -> None:
    parsed = invalid(line)
    assert parsed.reply.code == PARSE_ERROR
    assert parsed.reply.id is None


@pytest.mark.parametrize(
    "text",
    [
        "1.5",
        "1.0",
        "1e2",
        "-0.25",
        "18446744073709551616.5",
        # Beyond a double's range: orjson refuses the line, the re-read still sees a fraction.
        "1e400",
        "-2E+999",
        "5" * 400 + ".0",
    ],
)
def test_a_fractional_id_is_refused_without_echo(text: str) -> None:
    parsed = invalid(b'{"jsonrpc":"2.0","id":' + text.encode() + b',"method":"m"}')
    assert parsed.reply.code == INVALID_REQUEST
    assert parsed.reply.id is None
