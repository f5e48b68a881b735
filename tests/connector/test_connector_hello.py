"""The optional relay hello: allow-listed values only, first on the wire, within bounds."""

from __future__ import annotations

import json
from collections.abc import Callable

from connector_harness import Client, Host, connector_env, read_line, read_until_eof

from maple_acp_connector._hello import (
    MAX_TOTAL_BYTES,
    MAX_VALUE_BYTES,
    MAX_VALUES,
    build_hello,
)

StartClient = Callable[..., Client]


def environment_of(frame: bytes | None) -> dict[str, str]:
    assert frame is not None
    assert frame.endswith(b"\n")
    assert frame.count(b"\n") == 1
    message = json.loads(frame)
    assert message["jsonrpc"] == "2.0"
    assert message["method"] == "_maple/bridge/hello"
    assert "id" not in message  # a notification: the host never answers it
    environment = message["params"]["environment"]
    assert isinstance(environment, dict)
    return environment


def test_no_allow_list_means_no_hello() -> None:
    assert build_hello({"SECRET": "x"}) == (None, [])
    assert build_hello({"MAPLE_ACP_RELAY_ENV": " , ,", "SECRET": "x"}) == (None, [])


def test_only_listed_and_set_values_are_sent_in_list_order() -> None:
    frame, notes = build_hello(
        {
            "MAPLE_ACP_RELAY_ENV": " TOKEN_B, TOKEN_A ,UNSET,TOKEN_B",
            "TOKEN_A": "a",
            "TOKEN_B": "b ü",
            "NOT_LISTED": "hidden",
        }
    )
    assert notes == []
    assert list(environment_of(frame).items()) == [("TOKEN_B", "b ü"), ("TOKEN_A", "a")]


def test_listed_but_unset_still_sends_an_empty_hello() -> None:
    frame, notes = build_hello({"MAPLE_ACP_RELAY_ENV": "UNSET"})
    assert environment_of(frame) == {}
    assert notes == []


def test_invalid_names_are_skipped_with_a_note() -> None:
    frame, notes = build_hello(
        {"MAPLE_ACP_RELAY_ENV": "GOOD,1BAD,BAD-NAME,A=B", "GOOD": "g", "1BAD": "x"}
    )
    assert environment_of(frame) == {"GOOD": "g"}
    assert notes == [
        "not relaying 1BAD: not a valid environment variable name",
        "not relaying BAD-NAME: not a valid environment variable name",
        "not relaying A=B: not a valid environment variable name",
    ]


def test_at_most_sixteen_values() -> None:
    names = [f"V{index:02d}" for index in range(MAX_VALUES + 2)]
    env = {"MAPLE_ACP_RELAY_ENV": ",".join(names)} | {name: "v" for name in names}
    frame, notes = build_hello(env)
    assert list(environment_of(frame)) == names[:MAX_VALUES]
    assert notes == [f"not relaying {name}: more than 16 values" for name in names[MAX_VALUES:]]


def test_value_size_bound() -> None:
    at_limit = "a" * MAX_VALUE_BYTES
    over_limit = "é" * (MAX_VALUE_BYTES // 2 + 1)  # counted in UTF-8 bytes, not characters
    frame, notes = build_hello(
        {"MAPLE_ACP_RELAY_ENV": "FITS,TOO_BIG", "FITS": at_limit, "TOO_BIG": over_limit}
    )
    assert environment_of(frame) == {"FITS": at_limit}
    assert notes == ["not relaying TOO_BIG: its value is larger than 16384 bytes"]


def test_total_size_bound_keeps_later_values_that_fit() -> None:
    big = "b" * (MAX_VALUE_BYTES - 10)
    env = {"MAPLE_ACP_RELAY_ENV": "B1,B2,B3,SMALL", "B1": big, "B2": big, "B3": big, "SMALL": "s"}
    frame, notes = build_hello(env)
    sent = environment_of(frame)
    assert list(sent) == ["B1", "B2", "SMALL"]
    assert sum(len(name) + len(value) for name, value in sent.items()) <= MAX_TOTAL_BYTES
    assert notes == ["not relaying B3: relayed names and values would exceed 32768 bytes in all"]


def test_nul_and_undecodable_values_are_refused_without_echoing_them() -> None:
    frame, notes = build_hello(
        {
            "MAPLE_ACP_RELAY_ENV": "NUL,RAW,OK",
            "NUL": "sec\0ret",
            "RAW": "sec\udcffret",  # how os.environ carries bytes that are not UTF-8
            "OK": "fine",
        }
    )
    assert environment_of(frame) == {"OK": "fine"}
    assert notes == [
        "not relaying NUL: its value contains NUL",
        "not relaying RAW: its value is not valid UTF-8",
    ]
    assert not any("sec" in note for note in notes)


def test_hello_is_the_first_frame_on_the_socket(host: Host, start_client: StartClient) -> None:
    env = connector_env(
        MAPLE_ACP_RELAY_ENV="API_TOKEN,HUGE,UNSET_NAME",
        API_TOKEN="tok-123",
        HUGE="h" * (MAX_VALUE_BYTES + 1),
        OTHER_SECRET="never-sent",
    )
    client = start_client("--socket", str(host.path), env=env)
    conn = host.accept()
    # The client speaks at once; the hello must still come first.
    client.write(b'{"jsonrpc":"2.0","id":0,"method":"initialize"}\n')
    hello = read_line(conn)
    assert environment_of(hello) == {"API_TOKEN": "tok-123"}
    assert read_line(conn) == b'{"jsonrpc":"2.0","id":0,"method":"initialize"}\n'
    client.close_stdin()
    assert read_until_eof(conn) == b""
    conn.close()
    status, stderr = client.wait()
    assert status == 0
    assert stderr == "maple-acp: not relaying HUGE: its value is larger than 16384 bytes\n"


def test_without_allow_list_the_client_bytes_come_first(
    host: Host, start_client: StartClient
) -> None:
    client = start_client("--socket", str(host.path), env=connector_env(API_TOKEN="tok"))
    conn = host.accept()
    client.write(b"first\n")
    client.close_stdin()
    assert read_until_eof(conn) == b"first\n"
    conn.close()
    assert client.wait() == (0, "")
