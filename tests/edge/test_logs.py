"""What the edge logs: one INFO line per connection opened and closed and per session created,
loaded, resumed, closed and deleted; a normal disconnect is not a warning; no secret, ever
(every record at DEBUG is searched for planted values)."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
import trio
import trio.testing
from edge_harness import running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.wire import ProtocolError

#: Planted where a client could put a secret: a relay value, MCP header and URL credentials.
RELAY_SECRET = "relay-SECRET-5f2b9c77"
HEADER_SECRET = "header-SECRET-a41d0e93"
URL_SECRET = "url-SECRET-0c3e8a11"


async def test_lifecycle_lines_at_info_and_no_secret_at_any_level(
    tmp_path: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="maple_acp")
    config = AcpServiceConfig(allow_session_delete=True)
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        await client.notify("_maple/bridge/hello", {"environment": {"RELAY_TOKEN": RELAY_SECRET}})
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, '/tool shell {"command": "echo $RELAY_TOKEN"}')
        bad_server = {
            "type": "http",
            "name": "x",
            "url": f"http://user:{URL_SECRET}@127.0.0.1:9/mcp",
            "headers": [{"name": "Authorization", "value": HEADER_SECRET}],
        }
        with pytest.raises(ProtocolError):
            await client.load_session(sid, str(project), mcp_servers=[bad_server])
        await client.load_session(sid, str(project))
        await client.resume_session(sid, str(project))
        await client.close_session(sid)
        await client.load_session(sid, str(project))
        await client.delete_session(sid)
    infos = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and r.name.startswith("maple_acp.edge")
    ]
    assert "ACP connection opened" in infos
    assert any(line.startswith("ACP connection closed: ") for line in infos)
    for event in ("created", "loaded", "resumed", "closed", "deleted"):
        assert f"session {sid} {event}" in infos, event
    # A client that finished normally is no cause for a warning.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    text = "\n".join([r.getMessage() for r in caplog.records] + [caplog.text])
    for secret in (RELAY_SECRET, HEADER_SECRET, URL_SECRET):
        assert secret not in text


async def _pipe_and_finish(harness: object, lines: list[bytes]) -> list[dict[str, object]]:
    """Send ``lines``, finish sending at once, and read every answer until the service ends."""
    client_end, service_end = trio.testing.memory_stream_pair()
    received = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(harness.acp.serve_stream, service_end)  # type: ignore[attr-defined]
        await client_end.send_all(b"".join(lines))
        await client_end.send_eof()
        with trio.fail_after(30):
            while chunk := await client_end.receive_some():
                received += chunk
    return [orjson.loads(line) for line in received.splitlines()]


async def test_a_new_session_piped_right_before_end_of_input_gets_its_own_answer(
    tmp_path: Path, project: Path
) -> None:
    async with running_service(tmp_path) as harness:
        for _ in range(5):
            answers = await _pipe_and_finish(
                harness,
                [
                    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n',
                    orjson.dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": 2,
                            "method": "session/new",
                            "params": {"cwd": str(project), "mcpServers": []},
                        }
                    )
                    + b"\n",
                ],
            )
            by_id = {a["id"]: a for a in answers if "id" in a}
            assert by_id[1]["result"]["protocolVersion"] == 1
            new = by_id[2]
            if "error" in new:
                error = new["error"]
                assert isinstance(error, dict)
                assert error["code"] == -32600
                assert "ending" in error["message"]
            else:
                assert new["result"]["sessionId"]
        assert harness.runtime.status().leases == 0


async def test_debug_logs_each_request_without_its_params(
    tmp_path: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--log-level debug``: one line per request with its method, session, duration and
    outcome; never its params (the prompt here)."""
    caplog.set_level(logging.DEBUG, logger="maple_acp")
    async with running_service(tmp_path) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "a private prompt PROMPT-7c1d")
        with pytest.raises(ProtocolError):
            await client.call("session/load", {"sessionId": "nope", "cwd": str(project)})
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert any(line.startswith("request initialize: ok in ") for line in lines), lines
    assert any(line.startswith("request session/new: ok in ") for line in lines), lines
    assert any(line.startswith(f"request session/prompt session {sid}: ok in ") for line in lines)
    assert any(line.startswith("request session/load session nope: error -3") for line in lines)
    assert all(line.endswith(" s") for line in lines)
    assert not [r for r in caplog.records if "PROMPT-7c1d" in r.getMessage()]
