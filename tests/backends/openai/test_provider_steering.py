"""Steering the OpenAI-compatible backend against the loopback server: a message added while a
model request streams arrives as a user message in the next request; one added after the
last request is the message of a follow-up request in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from loopback import LoopbackProvider, Reply, text_reply, tool_call_reply
from provider_support import open_lease

from maple_acp.model import ItemKind
from maple_acp.runtime import AgentService, RunState, SteeringOutcome


def held(reply: Reply) -> tuple[Reply, trio.Event]:
    hold = trio.Event()
    reply.hold = hold
    return reply, hold


def messages(provider: LoopbackProvider, index: int) -> list[dict[str, Any]]:
    body = provider.chat_requests()[index].body
    assert isinstance(body, dict)
    result: list[dict[str, Any]] = body["messages"]
    return result


async def test_a_steer_during_a_request_is_in_the_next_one(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "a.txt").write_text("alpha\n")
    first, hold = held(tool_call_reply(("c1", "read_file", {"path": "a.txt"}), text="Reading."))
    provider.add(first, text_reply("done"))
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("read a")
        await provider.streaming.wait()
        assert await lease.steer("and say hello") is SteeringOutcome.INJECTED
        hold.set()
        assert (await run.wait()).state is RunState.COMPLETED
        sent = messages(provider, 1)
        # The tool's result first (the model asked for it), then the user's added message.
        assert [m["role"] for m in sent[-3:]] == ["assistant", "tool", "user"]
        assert sent[-1]["content"] == "and say hello"
        assert "alpha" in sent[-2]["content"]
        # Once: no third request.
        assert len(provider.chat_requests()) == 2
        users = [i.text for i in await lease.history() if i.kind is ItemKind.USER]
        assert users == ["read a", "and say hello"]
        await lease.release(close=True)


async def test_a_steer_during_the_last_answer_is_a_follow_up_request(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    answer, hold = held(text_reply("All done."))
    provider.add(answer, text_reply("Hello too."))
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("finish")
        await provider.streaming.wait()
        assert await lease.steer("one more thing") is SteeringOutcome.INJECTED
        hold.set()
        assert (await run.wait()).state is RunState.COMPLETED
        assert len(provider.chat_requests()) == 2
        sent = messages(provider, 1)
        # The first turn's exchange, then the message it did not take, once.
        assert [(m["role"], m["content"]) for m in sent[1:]] == [
            ("user", "finish"),
            ("assistant", "All done."),
            ("user", "one more thing"),
        ]
        # Stored as it happened: the message came while the answer was still to stream.
        history = await lease.history()
        assert [(i.kind.value, i.text) for i in history] == [
            ("user", "finish"),
            ("user", "one more thing"),
            ("assistant", "All done."),
            ("assistant", "Hello too."),
        ]
        await lease.release(close=True)
