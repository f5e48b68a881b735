"""The router against real MCP servers on loopback (see loopback_servers.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
import trio
from silent_listener import silent_listener

from maple_acp.mcp import (
    EXTERNAL_MCP_TOOL_NAME,
    REVOKED_MESSAGE,
    ExternalToolError,
    HttpMcpServer,
    McpRouter,
    McpSetupError,
    validate_servers,
)


def _url(ports: dict[str, int], variant: str) -> str:
    return f"http://127.0.0.1:{ports[variant]}/mcp"


def _server(
    ports: dict[str, int], variant: str, tag: str, name: str | None = None, **headers: str
) -> HttpMcpServer:
    pairs = (("X-Test-Tag", tag), *headers.items())
    return HttpMcpServer(name=name or variant, url=_url(ports, variant), headers=pairs)


@asynccontextmanager
async def running(*servers: HttpMcpServer, **options: Any) -> AsyncIterator[McpRouter]:
    """A router started in a nursery this test owns, revoked and fully closed on exit."""
    router = McpRouter(validate_servers(servers), **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.serve)
        try:
            yield router
        finally:
            router.revoke()
    await router.wait_closed()


async def _control(ports: dict[str, int], variant: str, path: str) -> Any:
    async with httpx2.AsyncClient(trust_env=False, timeout=5.0) as client:
        response = await client.get(f"http://127.0.0.1:{ports[variant]}{path}")
        response.raise_for_status()
        return response.json()


async def _records(ports: dict[str, int], tag: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = await _control(ports, "main", f"/_records?tag={tag}")
    return result


async def _wait_for_event(ports: dict[str, int], key: str, event: str) -> None:
    with trio.fail_after(10):
        # The events live in another process; polling is the only way to observe them.
        while event not in await _control(ports, "main", f"/_events?key={key}"):  # noqa: ASYNC110
            await trio.sleep(0.02)


async def _setup_error(*servers: HttpMcpServer, **options: Any) -> McpSetupError:
    router = McpRouter(validate_servers(servers), **options)
    async with trio.open_nursery() as nursery:
        with pytest.raises(McpSetupError) as info:
            await nursery.start(router.serve)
    await router.wait_closed()
    with pytest.raises(ExternalToolError, match=REVOKED_MESSAGE):
        await router.call("main__echo", {"text": "x"})
    return info.value


async def test_catalog_is_frozen_behind_one_flat_tool(
    loopback_ports: dict[str, int], tag: str
) -> None:
    async with running(_server(loopback_ports, "main", tag, name="Main Server")) as router:
        definition = router.tool_definition()
        ids = [
            "mainserver__echo",
            "mainserver__add",
            "mainserver__decorated",
            "mainserver__slow",
            "mainserver__big",
            "mainserver__huge",
        ]
        assert definition.name == EXTERNAL_MCP_TOOL_NAME
        assert definition.input_schema == {
            "type": "object",
            "additionalProperties": False,
            "required": ["tool", "arguments"],
            "properties": {
                "tool": {"type": "string", "enum": ids},
                "arguments": {"type": "object"},
            },
        }
        assert "Echo the text back." in definition.description
        assert '"text":{"title":"Text","type":"string"}' in definition.description
        decorated = next(t for t in router.tools if t.name == "decorated")
        assert set(decorated.definition) <= {
            "name",
            "title",
            "description",
            "inputSchema",
            "outputSchema",
        }
        assert "decoration" not in str(decorated.definition)
        assert "icon.png" not in definition.description


async def test_call_returns_sanitised_json_result(loopback_ports: dict[str, int], tag: str) -> None:
    async with running(_server(loopback_ports, "main", tag)) as router:
        assert await router.call("main__add", {"a": 2, "b": 3}) == {
            "content": [{"type": "text", "text": "5"}],
            "isError": False,
            "structuredContent": {"result": 5},
        }
        stripped = await router.call("main__decorated", {})
        assert stripped == {
            "content": [
                {"type": "text", "text": "plain"},
                {"type": "resource", "resource": {"uri": "file:///x.txt", "text": "inside"}},
            ],
            "isError": False,
        }


async def test_unknown_id_fails_before_any_request(
    loopback_ports: dict[str, int], tag: str
) -> None:
    async with running(_server(loopback_ports, "main", tag)) as router:
        before = len(await _records(loopback_ports, tag))
        for bad in ("main__nope", "echo", "", 7):
            with pytest.raises(ExternalToolError, match="unknown external MCP tool id"):
                await router.call(bad, {})  # type: ignore[arg-type]
        with pytest.raises(ExternalToolError, match="must be an object"):
            await router.call("main__echo", ["text"])  # type: ignore[arg-type]
        assert len(await _records(loopback_ports, tag)) == before
        assert (await router.call("main__echo", {"text": "still"}))["content"][0]["text"] == "still"


async def test_oversize_result_is_refused_and_router_stays_usable(
    loopback_ports: dict[str, int], tag: str
) -> None:
    async with running(_server(loopback_ports, "main", tag)) as router:
        with pytest.raises(ExternalToolError, match="larger than 4194304 bytes"):
            await router.call("main__big", {})
        with pytest.raises(ExternalToolError, match="exceeded the 8388608 byte limit"):
            await router.call("main__huge", {})
        assert (await router.call("main__echo", {"text": "ok"}))["content"][0]["text"] == "ok"


async def test_json_responses_are_bounded_too(loopback_ports: dict[str, int], tag: str) -> None:
    async with running(_server(loopback_ports, "json", tag)) as router:
        assert (await router.call("json__echo", {"text": "j"}))["content"][0]["text"] == "j"
        with pytest.raises(ExternalToolError, match="response body larger than 16777216 bytes"):
            await router.call("json__flood", {})
        assert (await router.call("json__echo", {"text": "k"}))["content"][0]["text"] == "k"


async def test_server_error_is_one_bounded_line_without_header_value(
    loopback_ports: dict[str, int], tag: str
) -> None:
    secret = "Bearer-value-that-must-stay-secret"
    async with running(_server(loopback_ports, "main", tag, Authorization=secret)) as router:
        result = await router.call("main__add", {"a": "not a number", "b": 1})
        assert result["isError"] is True
        assert secret not in str(result)


async def test_call_timeout_cancels_the_request_on_the_server(
    loopback_ports: dict[str, int], tag: str
) -> None:
    async with running(_server(loopback_ports, "main", tag), call_timeout=0.5) as router:
        with pytest.raises(ExternalToolError, match=r"timed out after 0\.5 seconds"):
            await router.call("main__slow", {"key": tag})
        await _wait_for_event(loopback_ports, tag, "cancelled")
        assert (await router.call("main__echo", {"text": "after"}))["content"][0]["text"] == "after"


async def test_cancelling_the_caller_frees_the_call_and_notifies_the_server(
    loopback_ports: dict[str, int], tag: str
) -> None:
    async with running(_server(loopback_ports, "main", tag)) as router:
        finished = trio.Event()

        async def caller(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await router.call("main__slow", {"key": tag})
            finished.set()

        async with trio.open_nursery() as nursery:
            scope = await nursery.start(caller)
            await _wait_for_event(loopback_ports, tag, "started")
            scope.cancel()
            with trio.fail_after(10):
                await finished.wait()
        await _wait_for_event(loopback_ports, tag, "cancelled")
        assert (await router.call("main__echo", {"text": "free"}))["content"][0]["text"] == "free"


async def test_revoke_mid_call_cancels_it_and_terminates_the_session(
    loopback_ports: dict[str, int], tag: str
) -> None:
    router = McpRouter(validate_servers([_server(loopback_ports, "main", tag)]))
    outcome: list[BaseException] = []

    async def caller() -> None:
        try:
            await router.call("main__slow", {"key": tag})
        except ExternalToolError as exc:
            outcome.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(router.serve)
        nursery.start_soon(caller)
        await _wait_for_event(loopback_ports, tag, "started")
        router.revoke()
        with trio.fail_after(10):
            await router.wait_closed()
    assert [str(e) for e in outcome] == [REVOKED_MESSAGE]
    await _wait_for_event(loopback_ports, tag, "cancelled")
    assert [r["method"] for r in await _records(loopback_ports, tag)].count("DELETE") == 1
    with pytest.raises(ExternalToolError) as info:
        await router.call("main__echo", {"text": "late"})
    assert str(info.value) == REVOKED_MESSAGE
    with pytest.raises(ExternalToolError, match=REVOKED_MESSAGE):
        router.tool_definition()
    assert router.tools == ()


async def test_lease_cancellation_still_terminates_the_session(
    loopback_ports: dict[str, int], tag: str
) -> None:
    router = McpRouter(validate_servers([_server(loopback_ports, "main", tag)]))
    async with trio.open_nursery() as lease:
        await lease.start(router.serve)
        lease.cancel_scope.cancel()
    assert router.revoked
    await router.wait_closed()
    assert "DELETE" in [r["method"] for r in await _records(loopback_ports, tag)]


async def test_expired_session_fails_the_call_without_reinitialising(
    loopback_ports: dict[str, int], tag: str
) -> None:
    async with running(_server(loopback_ports, "main", tag)) as router:
        await router.call("main__echo", {"text": "one"})
        await _control(loopback_ports, "main", f"/_drop?tag={tag}")
        before = await _records(loopback_ports, tag)
        with pytest.raises(ExternalToolError, match="session has expired; the call was not sent"):
            await router.call("main__echo", {"text": "two"})
        after = await _records(loopback_ports, tag)
        new_posts = [r for r in after[len(before) :] if r["method"] == "POST"]
        assert len(new_posts) == 1
        assert all("mcp-session-id" in r["headers"] for r in new_posts)
        # Later calls fail at once, without traffic.
        with pytest.raises(ExternalToolError, match="session has expired"):
            await router.call("main__echo", {"text": "three"})
        assert len(await _records(loopback_ports, tag)) == len(after)
    sessionless = [
        r for r in await _records(loopback_ports, tag) if "mcp-session-id" not in r["headers"]
    ]
    assert len(sessionless) == 1  # the one initialize


async def test_header_reaches_the_server_and_no_log_record(
    loopback_ports: dict[str, int], tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "distinctive-credential-9f3b7c1e"
    caplog.set_level(logging.DEBUG)
    async with running(_server(loopback_ports, "main", tag, Authorization=f"Bearer {secret}")) as r:
        await r.call("main__echo", {"text": "hello"})
        assert secret not in repr(r.tools)
    records = await _records(loopback_ports, tag)
    assert records
    assert all(rec["headers"]["authorization"] == f"Bearer {secret}" for rec in records)
    assert caplog.records
    for record in caplog.records:
        assert secret not in record.getMessage()
        assert secret not in (record.exc_text or "")


async def test_redirect_is_not_followed(loopback_ports: dict[str, int], tag: str) -> None:
    error = await _setup_error(_server(loopback_ports, "redirect", tag))
    assert "redirect" in error.message
    assert await _control(loopback_ports, "redirect", "/_reached") == []


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("many", "more than 256 tools"),
        ("badname", "tool #1 has a name that is not"),
        ("longname", "tool #0 has a name that is not 1 to 54 characters"),
        ("dupe", "tool #1 repeats the name"),
        ("repeat", "empty or repeated pagination cursor"),
        ("emptycursor", "empty or repeated pagination cursor"),
        ("pages17", "more than 16 pages"),
        ("bigtool", "tool #0 is larger than 262144 bytes"),
    ],
)
async def test_invalid_catalog_fails_setup(
    loopback_ports: dict[str, int], tag: str, variant: str, expected: str
) -> None:
    error = await _setup_error(_server(loopback_ports, variant, tag))
    assert error.message.startswith(f"MCP server #0 ('{variant}'): ")
    assert expected in error.message


async def test_paginated_catalog_is_followed(loopback_ports: dict[str, int], tag: str) -> None:
    async with running(_server(loopback_ports, "paged", tag)) as router:
        assert [t.id for t in router.tools] == ["paged__p0", "paged__p1", "paged__p2"]
        result = await router.call("paged__p1", {})
        assert result["content"] == [{"type": "text", "text": "p1"}]


async def test_lease_wide_tool_count_limit(loopback_ports: dict[str, int], tag: str) -> None:
    servers = [_server(loopback_ports, "max", tag, name=f"max{i}") for i in range(5)]
    error = await _setup_error(*servers)
    assert error.message == "MCP servers offer more than 1024 tools in all"


async def test_lease_wide_catalog_size_limit(loopback_ports: dict[str, int], tag: str) -> None:
    servers = [_server(loopback_ports, "fat", tag, name=f"fat{i}") for i in range(3)]
    error = await _setup_error(*servers)
    assert error.message == "MCP tool catalogs are larger than 2097152 bytes in all"


async def test_one_failing_server_closes_the_others(
    loopback_ports: dict[str, int], tag: str
) -> None:
    error = await _setup_error(
        _server(loopback_ports, "main", tag), _server(loopback_ports, "badname", tag)
    )
    assert error.message.startswith("MCP server #1 ('badname')")
    assert "DELETE" in [r["method"] for r in await _records(loopback_ports, tag)]


async def test_two_servers_and_concurrent_calls(loopback_ports: dict[str, int], tag: str) -> None:
    async with running(
        _server(loopback_ports, "main", tag), _server(loopback_ports, "paged", tag)
    ) as router:
        results: dict[int, dict[str, Any]] = {}

        async def one(i: int) -> None:
            results[i] = await router.call("main__echo", {"text": str(i)})

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
            nursery.start_soon(one, 99)
        assert {i: r["content"][0]["text"] for i, r in results.items()} == {
            i: str(i) for i in [*range(8), 99]
        }
        assert (await router.call("paged__p0", {}))["content"][0]["text"] == "p0"


async def test_setup_deadline_on_virtual_clock(autojump_clock: trio.testing.MockClock) -> None:
    # The silent server is in this process, so once everything waits on sockets the mock
    # clock jumps straight to the 30 s setup deadline.
    async with silent_listener() as (url, _):
        start = trio.current_time()
        error = await _setup_error(HttpMcpServer(name="silent", url=url))
        assert trio.current_time() - start == pytest.approx(30.0, abs=0.5)
    assert error.message == (
        "MCP server #0 ('silent'): did not connect and list its tools within 30 seconds"
    )


async def test_setup_deadline_is_shared_by_all_servers(
    loopback_ports: dict[str, int], tag: str
) -> None:
    # Real clock: a real server takes part, and a mock clock would jump past its answers. The
    # bound leaves the answering server time to connect on a loaded machine (at 0.5 s it
    # sometimes did not, and the error named it instead of the silent one).
    async with silent_listener() as (url, _):
        error = await _setup_error(
            _server(loopback_ports, "main", tag),
            HttpMcpServer(name="silent", url=url),
            setup_timeout=3.0,
        )
    assert error.message == (
        "MCP server #1 ('silent'): did not connect and list its tools within 3 seconds"
    )
    assert "DELETE" in [r["method"] for r in await _records(loopback_ports, tag)]


async def test_revoke_during_setup_fails_start(loopback_ports: dict[str, int]) -> None:
    async with silent_listener() as (url, _):
        router = McpRouter(validate_servers([HttpMcpServer(name="silent", url=url)]))
        async with trio.open_nursery() as nursery:

            async def revoke_soon() -> None:
                await trio.sleep(0.1)
                router.revoke()

            nursery.start_soon(revoke_soon)
            with pytest.raises(McpSetupError, match="cancelled because the session ended"):
                await nursery.start(router.serve)
        with trio.fail_after(5):
            await router.wait_closed()


async def test_connection_refused_fails_setup() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    error = await _setup_error(HttpMcpServer(name="gone", url=f"http://127.0.0.1:{port}/mcp"))
    assert error.message == "MCP server #0 ('gone'): could not connect"


def test_timeouts_are_configurable_only_downward() -> None:
    with pytest.raises(ValueError, match="setup_timeout"):
        McpRouter((), setup_timeout=31)
    with pytest.raises(ValueError, match="call_timeout"):
        McpRouter((), call_timeout=0)


async def test_empty_router_is_ready_and_revocable() -> None:
    async with running() as router:
        assert router.tool_definition().input_schema["properties"]["tool"]["enum"] == []
    assert router.revoked
