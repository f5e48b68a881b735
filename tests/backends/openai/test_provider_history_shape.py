"""History every OpenAI-compatible server accepts: an assistant message that carries only tool
calls has an empty string as its content, never null. llama.cpp's Python server renders the
conversation with the model's chat template, which joins each content as text: a null there
is an HTTP 500, and the follow-up request and every later turn of the session would fail."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import trio
from loopback import LoopbackProvider, Reply, text_reply, tool_call_reply
from provider_support import open_lease

from maple_acp.runtime import AgentService, RunState
from maple_acp.testing.demo import run_prompt

#: What llama.cpp's Python server answers when its chat template meets a null content.
TEMPLATE_FAILURE = Reply(
    status=500,
    body={
        "error": {
            "message": 'can only concatenate str (not "NoneType") to str',
            "type": "internal_server_error",
            "param": None,
            "code": None,
        }
    },
)


class TemplateRenderingServer(deque[Reply]):
    """The scripted replies, except that a request with a null content gets the server's 500
    (as a chat template that joins contents as text fails on it)."""

    def __init__(self, server: LoopbackProvider, *replies: Reply) -> None:
        super().__init__(replies)
        self.server = server

    def popleft(self) -> Reply:
        body: Any = self.server.requests[-1].body
        if any(message.get("content") is None for message in body["messages"]):
            return TEMPLATE_FAILURE
        return super().popleft()


async def test_tool_call_messages_carry_an_empty_string_in_the_turn_and_after_it(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.script = TemplateRenderingServer(
        provider,
        tool_call_reply(("call_1", "shell", {"command": "echo hi"})),
        text_reply("It printed hi."),
        text_reply("Yes."),
    )
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        with trio.fail_after(20):
            run = await lease.start_run("run echo hi")
            async for event in run.events():
                responder = getattr(event, "responder", None)
                if responder is not None:
                    responder.answer("allow_once")
            first = await run.wait()
            _, second = await run_prompt(lease, "sure?")
        await lease.release(close=False)
    assert first.state is RunState.COMPLETED
    assert second.state is RunState.COMPLETED
    requests = provider.chat_requests()
    assert len(requests) == 3
    for request in requests[1:]:
        calling = [m for m in request.body["messages"] if m.get("tool_calls")]
        assert len(calling) == 1
        assert calling[0]["content"] == ""
