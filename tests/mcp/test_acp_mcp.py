"""Transient MCP servers end to end through the ACP edge: a real ACP service over the demo
runtime and a real SQLite file, real MCP servers on loopback (see loopback_servers.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from acp_support import EVENT_WAIT_S, AcpHarness, Loopback, acp_http_server, running_acp
from silent_listener import silent_listener

from maple_acp.rpc import ConnectionClosed
from maple_acp.testing.client import AcpTestClient, reject
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import INVALID_PARAMS, ProtocolError


@pytest.fixture
def loopback(loopback_ports: dict[str, int]) -> Loopback:
    return Loopback(loopback_ports)


async def new_session_with_loopback(
    client: AcpTestClient, project: Path, loopback: Loopback, tag: str
) -> str:
    """A new session in ``project`` with the loopback MCP server as ``main`` (its records
    tagged ``tag``)."""
    server = acp_http_server(loopback.url(), tag=tag)
    session_id: str = (await client.new_session(str(project), mcp_servers=[server]))["sessionId"]
    return session_id


def tool_calls(client: AcpTestClient, sid: str) -> dict[str, list[dict[str, Any]]]:
    """Every tool call's updates, by tool call id, in arrival order."""
    calls: dict[str, list[dict[str, Any]]] = {}
    for update in client.updates(sid):
        if update.get("sessionUpdate") in ("tool_call", "tool_call_update"):
            calls.setdefault(update["toolCallId"], []).append(update)
    return calls


def only_call(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    calls = tool_calls(client, sid)
    assert len(calls) == 1, calls
    return next(iter(calls.values()))


def shown_text(update: dict[str, Any]) -> str:
    return "".join(part["content"]["text"] for part in update.get("content", []))


# -- a full session ----------------------------------------------------------------------------


async def test_allowed_call_reaches_the_server_and_its_result_the_client(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        sid = await new_session_with_loopback(client, project, loopback, tag)
        answer = await client.prompt(sid, '/mcp main__add {"a": 2, "b": 40}')
        assert answer["stopReason"] == "end_turn"

        [request] = client.permission_requests
        assert request["sessionId"] == sid
        assert request["toolCall"]["rawInput"] == {
            "tool": "main__add",
            "arguments": {"a": 2, "b": 40},
        }
        updates = only_call(client, sid)
        assert updates[0]["sessionUpdate"] == "tool_call"
        assert updates[0]["status"] == "pending"
        final = updates[-1]
        assert final["status"] == "completed"
        assert final["rawOutput"] == {
            "content": [{"type": "text", "text": "42"}],
            "isError": False,
            "structuredContent": {"result": 42},
        }
        assert '"text":"42"' in shown_text(final)

        calls = [r for r in await loopback.records(tag) if r.get("rpc") == "tools/call"]
        assert [(r["tool"], r["arguments"]) for r in calls] == [("add", {"a": 2, "b": 40})]
        assert client.validate(acp_schema) > 0


async def test_rejected_call_never_reaches_the_server(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect(permission=reject) as client:
        sid = await new_session_with_loopback(client, project, loopback, tag)
        answer = await client.prompt(sid, '/mcp main__echo {"text": "no"}')
        assert answer["stopReason"] == "end_turn"
        assert len(client.permission_requests) == 1
        final = only_call(client, sid)[-1]
        assert final["status"] == "failed"
        assert shown_text(final) == "permission denied"
        rpcs = [r.get("rpc") for r in await loopback.records(tag)]
        assert "tools/list" in rpcs  # the session was connected ...
        assert "tools/call" not in rpcs  # ... and the call was not sent
        client.validate(acp_schema)


async def test_a_server_that_drops_its_session_is_told_once_as_a_notice(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect(initialize=False) as client:
        await client.initialize(clientCapabilities={"session": {"notices": {}}})
        sid = await new_session_with_loopback(client, project, loopback, tag)
        await client.prompt(sid, '/mcp main__echo {"text": "one"}')
        await loopback._get(f"/_drop?tag={tag}")
        await client.prompt(sid, '/mcp main__echo {"text": "two"}\n/mcp main__echo {"text": "3"}')
        notices = [u for u in client.updates(sid) if u["sessionUpdate"] == "notice"]
        # Both calls fail, the user hears once that the server's tools are gone.
        assert [(n["severity"], n["title"]) for n in notices] == [
            (
                "warning",
                "MCP server #0 ('main') ended its MCP session; its tools are unavailable for the "
                "rest of this session",
            )
        ]
        finals = [updates[-1] for updates in tool_calls(client, sid).values()]
        assert [final["status"] for final in finals] == ["completed", "failed", "failed"]
        assert "session has expired" in shown_text(finals[1])
        client.validate(acp_schema)


async def test_every_call_asks(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        sid = await new_session_with_loopback(client, project, loopback, tag)
        script = '/mcp main__echo {"text": "one"}\n/mcp main__echo {"text": "one"}'
        await client.prompt(sid, script)
        await client.prompt(sid, '/mcp main__echo {"text": "one"}')
        # The same call three times: an allow is never remembered.
        assert len(client.permission_requests) == 3
        ids = {r["toolCall"]["toolCallId"] for r in client.permission_requests}
        assert len(ids) == 3
        calls = tool_calls(client, sid)
        assert [updates[-1]["status"] for updates in calls.values()] == ["completed"] * 3
        sent = [r for r in await loopback.records(tag) if r.get("rpc") == "tools/call"]
        assert len(sent) == 3
        client.validate(acp_schema)


async def test_unknown_id_fails_before_any_network_call(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        sid = await new_session_with_loopback(client, project, loopback, tag)
        before = await loopback.records(tag)
        answer = await client.prompt(sid, '/mcp main__nope {"text": "x"}')
        assert answer["stopReason"] == "end_turn"
        final = only_call(client, sid)[-1]
        assert final["status"] == "failed"
        assert shown_text(final) == "unknown external MCP tool id"
        assert await loopback.records(tag) == before
        # The router is still usable.
        await client.prompt(sid, '/mcp main__echo {"text": "still"}')
        sent = [r for r in await loopback.records(tag) if r.get("rpc") == "tools/call"]
        assert [r["arguments"] for r in sent] == [{"text": "still"}]
        client.validate(acp_schema)


# -- validation at the ACP level ---------------------------------------------------------------

#: Appears in every bad definition's header values and URL credentials; never in an answer.
SECRET = "SECRET-c0ffee5e7a1d"
URL = "http://127.0.0.1:9/mcp"


def _http(url: str = URL, name: str = "main", *headers: tuple[str, str]) -> dict[str, Any]:
    pairs = [("Authorization", f"Bearer {SECRET}"), *headers]
    return {
        "type": "http",
        "name": name,
        "url": url,
        "headers": [{"name": key, "value": value} for key, value in pairs],
    }


BAD_DEFINITIONS: list[Any] = [
    pytest.param(
        [
            {
                "name": "local",
                "command": "/bin/true",
                "args": [SECRET],
                "env": [{"name": "TOKEN", "value": SECRET}],
            }
        ],
        "stdio MCP servers are not supported",
        id="stdio",
    ),
    pytest.param([{**_http(), "type": "sse"}], "SSE MCP servers are not supported", id="sse"),
    pytest.param(
        [_http("https://127.0.0.1:9/mcp")], "URL must be plain http:// to localhost", id="https"
    ),
    pytest.param(
        [_http("http://example.com/mcp")], "URL must be plain http:// to localhost", id="remote"
    ),
    pytest.param(
        [_http("http://10.0.0.1:80/mcp")], "URL must be plain http:// to localhost", id="lan-ip"
    ),
    pytest.param(
        [_http(f"http://user:{SECRET}@127.0.0.1:9/mcp")],
        "URL must not contain credentials",
        id="userinfo",
    ),
    pytest.param(
        [_http(f"http://127.0.0.1:9/mcp?token={SECRET}#part")],
        "URL must not have a fragment",
        id="fragment",
    ),
    pytest.param(
        [_http(URL, "main", ("Host", SECRET))], "uses the reserved name 'host'", id="reserved"
    ),
    pytest.param(
        [_http(URL, "main", ("X-Forwarded-For", SECRET))],
        "uses the reserved prefix 'x-forwarded-'",
        id="reserved-prefix",
    ),
    pytest.param(
        [_http(URL, "main", ("AUTHORIZATION", SECRET))],
        "header #1 repeats an earlier header name",
        id="duplicate-header",
    ),
    pytest.param(
        [_http(URL, "main", ("X-Token", f"{SECRET}\r\nX-Injected: 1"))],
        "header #1 value contains CR, LF or NUL",
        id="crlf",
    ),
    pytest.param(
        [_http(URL, "main", ("X-Token", f"{SECRET}\x00"))],
        "header #1 value contains CR, LF or NUL",
        id="nul",
    ),
    pytest.param(
        [_http(URL, "main", ("X-Token", SECRET * (16 * 1024 // len(SECRET) + 1)))],
        "header #1 value is larger than 16384 bytes",
        id="oversize-value",
    ),
    pytest.param(
        [
            _http(URL, "main", *((f"X-Token-{i}", SECRET * 700) for i in range(6))),
        ],
        "headers are larger than 65536 bytes in total",
        id="oversize-headers",
    ),
    pytest.param(
        [_http(URL, f"server{i}") for i in range(17)],
        "at most 16 MCP servers are allowed per session",
        id="17-servers",
    ),
    pytest.param(
        [_http(URL, "Main Server"), _http(URL, "mainserver")],
        "MCP server #1 ('mainserver'): name 'mainserver' is not unique after normalisation",
        id="duplicate-names",
    ),
    pytest.param([_http(URL, "")], "name must be 1 to 64 characters", id="empty-name"),
]


async def _assert_nothing_created(acp: AcpHarness, client: AcpTestClient) -> None:
    assert (await client.list_sessions())["sessions"] == []
    assert tuple((await acp.runtime.list_tasks()).tasks) == ()
    assert acp.stored_task_ids() == []


def _assert_refused(client: AcpTestClient, info: pytest.ExceptionInfo[ProtocolError]) -> None:
    assert info.value.code == INVALID_PARAMS
    # The whole error frame the client received, not just the parsed message.
    [frame] = [
        f.raw
        for f in client.frames
        if f.direction == "in" and isinstance(f.message, dict) and "error" in f.message
    ]
    assert SECRET.encode() not in frame
    assert b"user:" not in frame


@pytest.mark.parametrize(("servers", "expected"), BAD_DEFINITIONS)
async def test_bad_definitions_are_refused_on_new_and_nothing_is_created(
    tmp_path: Path, project: Path, servers: list[Any], expected: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        with pytest.raises(ProtocolError) as info:
            await client.new_session(str(project), mcp_servers=servers)
        assert expected in info.value.message
        _assert_refused(client, info)
        await _assert_nothing_created(acp, client)
        # The connection is still usable.
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "/echo fine"))["stopReason"] == "end_turn"
        assert client.text(sid) == "fine"
        client.validate(acp_schema)


@pytest.mark.parametrize(
    ("servers", "expected"),
    [p for p in BAD_DEFINITIONS if p.id in ("userinfo", "crlf", "17-servers")],
)
async def test_bad_definitions_are_refused_on_load_and_the_task_stays_free(
    tmp_path: Path, project: Path, servers: list[Any], expected: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp:
        async with acp.connect() as first:
            sid = (await first.new_session(str(project)))["sessionId"]
            await first.prompt(sid, "/echo kept")
        async with acp.connect() as client:
            with pytest.raises(ProtocolError) as info:
                await client.load_session(sid, str(project), mcp_servers=servers)
            assert expected in info.value.message
            _assert_refused(client, info)
            assert client.updates(sid) == []  # no history was replayed
            await client.load_session(sid, str(project))
            assert client.text(sid) == "kept"
            client.validate(acp_schema)


# -- secrets -----------------------------------------------------------------------------------


async def test_header_and_url_query_never_leave_the_router(
    tmp_path: Path,
    project: Path,
    loopback: Loopback,
    tag: str,
    acp_schema: AcpSchema,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    header_secret = f"SECRET-7f3a9c{uuid.uuid4().hex}"
    query_secret = f"QUERY-51d0e2{uuid.uuid4().hex}"
    secrets = (header_secret.encode(), query_secret.encode())
    decisions = iter(["allow", "allow", "reject", "allow"])

    def policy(params: Mapping[str, Any]) -> str:
        return next(decisions)

    async with running_acp(tmp_path) as acp:
        async with acp.connect(permission=policy) as client:
            server = acp_http_server(
                loopback.url(query=f"sig={query_secret}"),
                tag=tag,
                Authorization=f"Bearer {header_secret}",
            )
            sid = (await client.new_session(str(project), mcp_servers=[server]))["sessionId"]
            script = "\n".join(
                [
                    '/mcp main__echo {"text": "hello"}',
                    '/mcp main__add {"a": "not a number", "b": 1}',  # a server-side error
                    '/mcp main__echo {"text": "rejected"}',
                    "/mcp main__nope {}",
                ]
            )
            assert (await client.prompt(sid, script))["stopReason"] == "end_turn"
            statuses = [u[-1]["status"] for u in tool_calls(client, sid).values()]
            assert statuses == ["completed", "completed", "failed", "failed"]
            while_running = acp.store_bytes()
            assert await client.close_session(sid) == {}
            client.validate(acp_schema)
        frames = [f.raw for f in client.frames if f.direction == "in"]
    after_shutdown = acp.store_bytes()

    # The server did receive both, so the searches below look for values that really flowed.
    records = await loopback.records(tag)
    assert records
    assert {r["headers"]["authorization"] for r in records} == {f"Bearer {header_secret}"}
    assert {r["query"] for r in records} == {f"sig={query_secret}"}

    assert b"main__echo" in after_shutdown  # the store does hold the session's tool rows
    assert caplog.records
    for secret in secrets:
        assert secret not in while_running
        assert secret not in after_shutdown
        assert not [frame for frame in frames if secret in frame]
        assert secret.decode() not in caplog.text
        for record in caplog.records:
            assert secret.decode() not in record.getMessage()
            assert secret.decode() not in (record.exc_text or "")


# -- revocation --------------------------------------------------------------------------------


async def _replayed_calls(acp: AcpHarness, sid: str, project: Path) -> list[dict[str, Any]]:
    async with acp.connect() as client:
        await client.load_session(sid, str(project))
        return [u for updates in tool_calls(client, sid).values() for u in updates]


async def test_close_mid_call_cancels_it_and_ends_the_server_session(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp:
        async with acp.connect() as client:
            sid = await new_session_with_loopback(client, project, loopback, tag)
            answers: list[Any] = []

            async def prompt() -> None:
                answers.append(await client.prompt(sid, f'/mcp main__slow {{"key": "{tag}"}}'))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(prompt)
                await loopback.wait_for_event(tag, "started")
                assert "DELETE" not in await loopback.methods(tag)
                assert await client.close_session(sid) == {}
            assert [a["stopReason"] for a in answers] == ["cancelled"]
            await loopback.wait_for_event(tag, "cancelled")
            await loopback.wait_for_method(tag, "DELETE")
            assert (await loopback.methods(tag)).count("DELETE") == 1

            # A later session without servers has no external tools at all.
            other = (await client.new_session(str(project)))["sessionId"]
            assert (await client.prompt(other, '/mcp main__echo {"text": "x"}'))[
                "stopReason"
            ] == "end_turn"
            final = only_call(client, other)[-1]
            assert final["status"] == "failed"
            assert shown_text(final) == "no external MCP servers are connected to this session"
            assert [r for r in await loopback.records(tag) if r.get("rpc") == "tools/call"] == [
                r for r in await loopback.records(tag) if r.get("tool") == "slow"
            ]
            client.validate(acp_schema)
        # The cancelled call is stored as ended, not left pending.
        [row] = await _replayed_calls(acp, sid, project)
        assert row["title"] == "external_mcp: main__slow"
        assert row["status"] == "failed"
        assert shown_text(row) == "the tool call ended cancelled"


async def test_disconnect_mid_call_cancels_it_and_ends_the_server_session(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str
) -> None:
    async with running_acp(tmp_path) as acp:
        async with acp.connect() as client:
            sid = await new_session_with_loopback(client, project, loopback, tag)
            async with trio.open_nursery() as nursery:

                async def prompt() -> None:
                    with pytest.raises(ConnectionClosed):
                        await client.prompt(sid, f'/mcp main__slow {{"key": "{tag}"}}')

                nursery.start_soon(prompt)
                await loopback.wait_for_event(tag, "started")
                await client.peer.aclose()
        # connect() returned once the service finished the disconnect's cleanup.
        await loopback.wait_for_event(tag, "cancelled")
        await loopback.wait_for_method(tag, "DELETE")
        assert (await loopback.methods(tag)).count("DELETE") == 1
        # The lease is gone: another connection can load the task (and gets no tools).
        async with acp.connect() as again:
            await again.load_session(sid, str(project))
            await again.prompt(sid, '/mcp main__echo {"text": "x"}')
            calls = tool_calls(again, sid)
            final = list(calls.values())[-1][-1]
            assert shown_text(final) == "no external MCP servers are connected to this session"


# -- setup failures: session/load connects before ownership, session/new leaves nothing ----------


async def _closed_port_url() -> str:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    return f"http://127.0.0.1:{port}/mcp"


async def _prompted_task(acp: AcpHarness, project: Path) -> str:
    async with acp.connect() as client:
        sid: str = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "/echo kept")
    return sid


async def _assert_loadable_without_servers(acp: AcpHarness, sid: str, project: Path) -> None:
    async with acp.connect() as client:
        await client.load_session(sid, str(project))
        assert client.text(sid) == "kept"


async def test_load_with_an_unreachable_server_fails_and_leaves_the_task_free(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp:
        sid = await _prompted_task(acp, project)
        url = await _closed_port_url()
        async with acp.connect() as client:
            with pytest.raises(ProtocolError) as info:
                await client.load_session(
                    sid, str(project), mcp_servers=[acp_http_server(url, "gone")]
                )
            assert info.value.code == INVALID_PARAMS
            assert info.value.message == "MCP server #0 ('gone'): could not connect"
            assert client.updates(sid) == []  # refused before any history was replayed
            # The same connection can load it at once: the failed load held nothing.
            await client.load_session(sid, str(project))
            assert client.text(sid) == "kept"
            client.validate(acp_schema)


async def test_load_takes_no_ownership_while_its_servers_connect(
    tmp_path: Path, project: Path
) -> None:
    # The router's 30 s setup deadline itself is tested on a virtual clock at the router
    # level; here the store's worker threads would let a virtual clock cut the run short.
    async with running_acp(tmp_path) as acp:
        sid = await _prompted_task(acp, project)
        async with (
            silent_listener() as (url, accepted),
            acp.connect() as client,
            trio.open_nursery() as nursery,
        ):

            async def load() -> None:
                with pytest.raises(ConnectionClosed):
                    await client.load_session(
                        sid, str(project), mcp_servers=[acp_http_server(url, "silent")]
                    )

            nursery.start_soon(load)
            with trio.fail_after(EVENT_WAIT_S):
                await accepted.wait()
            # Still connecting: no lease holds the task and nothing was replayed. (A prompt
            # for the session would not tell: written after the load, it waits for the load's
            # decision, as a one-at-a-time reading would.)
            await trio.testing.wait_all_tasks_blocked()
            assert acp.runtime.lease_of(sid) is None
            assert client.updates(sid) == []
            # Disconnect in the middle of the setup.
            await client.peer.aclose()
        # The abandoned setup held nothing: the task loads at once, without servers.
        await _assert_loadable_without_servers(acp, sid, project)


async def test_invalid_catalog_fails_new_and_leaves_no_task(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        good = acp_http_server(loopback.url(), tag=tag)
        bad = acp_http_server(loopback.url("badname"), "badname", tag=tag)
        with pytest.raises(ProtocolError) as info:
            await client.new_session(str(project), mcp_servers=[good, bad])
        assert info.value.code == INVALID_PARAMS
        assert info.value.message.startswith("MCP server #1 ('badname'): tool #1 has a name")
        await _assert_nothing_created(acp, client)
        # The good server's session was ended too.
        await loopback.wait_for_method(tag, "DELETE")
        sid = (await client.new_session(str(project), mcp_servers=[good]))["sessionId"]
        await client.prompt(sid, '/mcp main__echo {"text": "ok"}')
        assert only_call(client, sid)[-1]["status"] == "completed"
        client.validate(acp_schema)


# -- re-attach: a load on the connection that holds the session ---------------------------------


def _tool_outcomes(client: AcpTestClient, sid: str) -> list[tuple[str, str]]:
    """(status, shown text) of the last row of each tool call, in call order."""
    return [(rows[-1]["status"], shown_text(rows[-1])) for rows in tool_calls(client, sid).values()]


async def test_reload_replaces_the_sessions_servers_with_the_requests(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        first = acp_http_server(loopback.url(), "first", tag=tag)
        sid = (await client.new_session(str(project), mcp_servers=[first]))["sessionId"]
        await client.prompt(sid, '/mcp first__echo {"text": "one"}')
        second = acp_http_server(loopback.url(), "second", tag=tag)
        await client.load_session(sid, str(project), mcp_servers=[second])
        await client.prompt(sid, '/mcp second__echo {"text": "two"}')
        await client.prompt(sid, '/mcp first__echo {"text": "gone"}')
        outcomes = _tool_outcomes(client, sid)
        assert outcomes[-1] == ("failed", "unknown external MCP tool id")
        assert outcomes[-2][0] == "completed"
        sent = [r for r in await loopback.records(tag) if r.get("rpc") == "tools/call"]
        assert [r["arguments"] for r in sent] == [{"text": "one"}, {"text": "two"}]
        # A re-attach with no servers leaves the session with none.
        await client.load_session(sid, str(project))
        await client.prompt(sid, '/mcp second__echo {"text": "none"}')
        assert _tool_outcomes(client, sid)[-1][0] == "failed"
        client.validate(acp_schema)


async def test_reload_whose_servers_fail_keeps_the_old_ones(
    tmp_path: Path, project: Path, loopback: Loopback, tag: str, acp_schema: AcpSchema
) -> None:
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        server = acp_http_server(loopback.url(), tag=tag)
        sid = (await client.new_session(str(project), mcp_servers=[server]))["sessionId"]
        await client.prompt(sid, "/echo kept")
        url = await _closed_port_url()
        for method in (client.load_session, client.resume_session):
            with pytest.raises(ProtocolError) as info:
                await method(sid, str(project), mcp_servers=[acp_http_server(url, "gone")])
            assert info.value.code == INVALID_PARAMS
            assert info.value.message == "MCP server #0 ('gone'): could not connect"
        await client.prompt(sid, '/mcp main__echo {"text": "still"}')
        assert _tool_outcomes(client, sid)[-1][0] == "completed"
        sent = [r for r in await loopback.records(tag) if r.get("rpc") == "tools/call"]
        assert [r["arguments"] for r in sent] == [{"text": "still"}]
        client.validate(acp_schema)
