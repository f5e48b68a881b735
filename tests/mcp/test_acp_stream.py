"""The router over a client's ``mcp/message`` channel without a wire: what the forwarder makes
of each kind of answer, and the limits that are the router's whatever the transport (a result
over 4 MiB is larger than a test client may send on a connection at once)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio
from client_tools import BIG_TEXT_CHARS, ScriptedTools

from maple_acp.mcp import ExternalToolError, McpRouter, McpSetupError, ValidatedServer


class DirectChannel:
    """The client's end handed the router's params straight to ``answer``."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer
        self.sent: list[Mapping[str, Any]] = []

    @property
    def session_id(self) -> str:
        return "session-1"

    async def request(self, params: Mapping[str, Any]) -> Any:
        self.sent.append(params)
        return await self._answer(dict(params))


def page(index: int = 0) -> ValidatedServer:
    return ValidatedServer(index=index, name="page", key="page", server_id=f"id-{index}")


async def test_a_result_over_4_mib_is_refused_and_the_router_goes_on() -> None:
    tools = ScriptedTools()
    channel = DirectChannel(tools.handle)
    async with trio.open_nursery() as nursery:
        router = McpRouter([page()], channel=channel)
        await nursery.start(router.serve)
        with pytest.raises(ExternalToolError) as refused:
            await router.call("page__big", {}, call_id="call-7")
        assert refused.value.message == "the tool result is larger than 4194304 bytes"
        assert BIG_TEXT_CHARS > 4 * 1024 * 1024
        assert channel.sent[-1]["_meta"] == {
            "maple.sessionId": "session-1",
            "maple.toolCallId": "call-7",
        }
        assert await router.call("page__echo", {"text": "still"}) == {
            "content": [{"type": "text", "text": "still"}],
            "isError": False,
        }
        router.revoke()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"result": None}, "the client's MCP result is not an object"),
        ({}, "the client answered mcp/message with neither outcome"),
        ({"error": {"code": "x", "message": "m"}}, "with neither outcome"),
    ],
)
async def test_an_answer_that_is_no_inner_outcome_is_an_inner_error(
    answer: dict[str, Any], reason: str
) -> None:
    tools = ScriptedTools()

    async def answer_calls(params: dict[str, Any]) -> Any:
        if params["method"] == "tools/call":
            return answer
        return await tools.handle(params)

    async with trio.open_nursery() as nursery:
        router = McpRouter([page()], channel=DirectChannel(answer_calls))
        await nursery.start(router.serve)
        with pytest.raises(ExternalToolError) as failed:
            await router.call("page__echo", {})
        assert reason in failed.value.message
        router.revoke()


async def test_a_client_that_refuses_the_outer_request_fails_the_setup_in_one_line() -> None:
    async def refuse(params: dict[str, Any]) -> Any:
        raise RuntimeError("method not found: mcp/message")

    async with trio.open_nursery() as nursery:
        router = McpRouter([page()], channel=DirectChannel(refuse))
        with pytest.raises(McpSetupError) as failed:
            await nursery.start(router.serve)
    assert failed.value.message == (
        "MCP server #0 ('page'): the client refused the MCP handshake (error -32603: the client "
        "failed it: method not found: mcp/message)"
    )


async def test_a_client_side_server_without_a_channel_fails_the_setup() -> None:
    async with trio.open_nursery() as nursery:
        with pytest.raises(McpSetupError) as failed:
            await nursery.start(McpRouter([page()]).serve)
    assert "no client connection" in failed.value.message
