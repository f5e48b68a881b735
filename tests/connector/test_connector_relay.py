"""The relay through a real connector subprocess against a real Unix-socket host."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

import pytest
from connector_harness import (
    Background,
    Client,
    Host,
    connector_env,
    read_exactly,
    read_line,
    read_until_eof,
)

StartClient = Callable[..., Client]

STDIO_KINDS = ["pipe", "socketpair"]
# The same relay with splice forced off, as on a platform without os.splice.
COPY_ONLY = [
    sys.executable,
    "-I",
    "-c",
    "import sys; from maple_acp_connector._relay import run; "
    "sys.exit(run(sys.argv[2], use_splice=False))",
]


@pytest.mark.parametrize("stdio", STDIO_KINDS)
def test_request_and_response_round_trip(host: Host, start_client: StartClient, stdio: str) -> None:
    client = start_client("--socket", str(host.path), stdio=stdio)
    conn = host.accept()
    client.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize"}\n')
    assert read_line(conn) == b'{"jsonrpc":"2.0","id":1,"method":"initialize"}\n'
    conn.sendall(b'{"jsonrpc":"2.0","id":1,"result":{}}\n')
    assert client.read(37) == b'{"jsonrpc":"2.0","id":1,"result":{}}\n'
    # A second exchange on the same connection: nothing was buffered or lost in between.
    client.write(b"ping\n")
    assert read_line(conn) == b"ping\n"
    conn.sendall(b"pong\n")
    assert client.read(5) == b"pong\n"

    client.close_stdin()
    assert read_until_eof(conn) == b""
    conn.close()
    assert client.read_all() == b""
    assert client.wait() == (0, "")


@pytest.mark.parametrize("stdio", STDIO_KINDS)
@pytest.mark.parametrize("copy_only", [False, True], ids=["auto", "copy"])
def test_five_mebibytes_both_ways_arrive_intact(
    host: Host, start_client: StartClient, stdio: str, copy_only: bool
) -> None:
    upstream = os.urandom(5 * 1024 * 1024)
    downstream = os.urandom(5 * 1024 * 1024)
    client = start_client(
        "--socket", str(host.path), stdio=stdio, command=COPY_ONLY if copy_only else None
    )
    conn = host.accept()

    def client_sends() -> None:
        client.write(upstream)
        client.close_stdin()

    def host_sends() -> None:
        conn.sendall(downstream)

    sending = [Background(client_sends), Background(host_sends)]
    received_by_client = Background(client.read_all)
    received_by_host = read_until_eof(conn)
    for work in sending:
        work.result()
    conn.close()

    assert received_by_host == upstream
    assert received_by_client.result() == downstream
    assert client.wait() == (0, "")


@pytest.mark.parametrize("stdio", STDIO_KINDS)
def test_stdin_end_half_closes_and_host_output_still_arrives(
    host: Host, start_client: StartClient, stdio: str
) -> None:
    client = start_client("--socket", str(host.path), stdio=stdio)
    conn = host.accept()
    client.write(b"last request\n")
    client.close_stdin()
    # The host sees the request, then the end of the client's input ...
    assert read_until_eof(conn) == b"last request\n"
    # ... and may keep answering for a while before it closes.
    for index in range(3):
        time.sleep(0.05)
        conn.sendall(b"late answer %d\n" % index)
    conn.close()
    assert client.read_all() == b"late answer 0\nlate answer 1\nlate answer 2\n"
    assert client.wait() == (0, "")


@pytest.mark.parametrize("stdio", STDIO_KINDS)
def test_host_closing_first_ends_connector_with_stdin_open(
    host: Host, start_client: StartClient, stdio: str
) -> None:
    client = start_client("--socket", str(host.path), stdio=stdio)
    conn = host.accept()
    conn.sendall(b"goodbye\n")
    conn.close()
    # stdin is never closed here: the connector must not wait for it.
    assert client.read_all() == b"goodbye\n"
    status, stderr = client.wait()
    assert status == 3
    assert stderr.count("\n") == 1
    assert stderr.startswith("maple-acp: the maple-acp service at ")
    assert "closed the connection" in stderr


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)]
)
def test_stop_signal_mid_relay_exits_cleanly(
    host: Host, start_client: StartClient, signum: int, status: int
) -> None:
    client = start_client("--socket", str(host.path))
    conn = host.accept()
    # Make sure both directions are running before the signal lands.
    client.write(b"hello\n")
    assert read_line(conn) == b"hello\n"
    conn.sendall(b"world\n")
    assert client.read(6) == b"world\n"

    client.proc.send_signal(signum)
    assert client.wait() == (status, "")
    conn.close()


def test_client_that_stops_reading_ends_connector_quietly(
    host: Host, start_client: StartClient
) -> None:
    client = start_client("--socket", str(host.path))
    conn = host.accept()
    conn.sendall(b"first\n")
    assert client.read(6) == b"first\n"
    client.close_stdout()

    def host_keeps_sending() -> None:
        try:
            while True:
                conn.sendall(b"x" * 65536)
        except OSError:
            return  # the connector is gone

    sender = Background(host_keeps_sending)
    status, stderr = client.wait()
    assert (status, stderr) == (128 + signal.SIGPIPE, "")
    conn.close()
    sender.result()


def test_endpoint_from_environment_variable(host: Host, start_client: StartClient) -> None:
    client = start_client(env=connector_env(MAPLE_ACP_SOCKET=str(host.path)))
    conn = host.accept()
    client.write(b"via environment\n")
    assert read_line(conn) == b"via environment\n"
    client.close_stdin()
    assert read_until_eof(conn) == b""
    conn.close()
    assert client.wait() == (0, "")


def test_maple_acp_acp_is_the_same_connector(host: Host, start_client: StartClient) -> None:
    script = os.path.join(os.path.dirname(sys.executable), "maple-acp")
    if not os.path.exists(script):
        pytest.skip("the maple-acp console script is not installed next to this interpreter")
    client = start_client("acp", "--socket", str(host.path), command=[script])
    conn = host.accept()
    client.write(b"through maple-acp acp\n")
    assert read_line(conn) == b"through maple-acp acp\n"
    conn.sendall(b"answer\n")
    assert client.read(7) == b"answer\n"
    client.close_stdin()
    assert read_exactly(conn, 1) == b""
    conn.close()
    assert client.wait() == (0, "")
