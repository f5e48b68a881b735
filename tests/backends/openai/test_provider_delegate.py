"""The ``delegate`` tool of the provider engines (the foundation's, here through the
OpenAI-compatible engine and a loopback server): the model's call runs a child session whose
request offers no ``delegate``, the parent's next request carries the child's answer as the
call's result, and five calls in one answer run at most four at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from loopback import LoopbackProvider, Reply, chunk, text_reply, tool_call_reply
from provider_support import open_lease

from maple_acp.runtime import (
    MAX_RUNNING_CHILDREN,
    AgentService,
    ChildEnded,
    ChildRunning,
    RunState,
)
from maple_acp.testing.demo import collect_events


def tool_names(body: Any) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools", [])]


def held_text(text: str, release: trio.Event) -> Reply:
    return Reply(events=[chunk(content=text), chunk(finish_reason="stop")], hold=release)


async def test_a_delegate_call_runs_a_child_and_returns_its_answer(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        tool_call_reply(("call_d", "delegate", {"title": "Count", "prompt": "count the files"})),
        text_reply("there are ", "three"),
        text_reply("done"),
    )
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("ask a helper")
        events = await collect_events(run)
        assert (await run.wait()).state is RunState.COMPLETED
        await lease.release(close=False)
    parent, child, after = (r.body for r in provider.chat_requests())
    assert "delegate" in tool_names(parent)
    # The child is offered the session's tools, never delegate; it sees only its prompt.
    assert "shell" in tool_names(child)
    assert "delegate" not in tool_names(child)
    assert [m["role"] for m in child["messages"]] == ["system", "user"]
    assert child["messages"][-1]["content"] == "count the files"
    assert after["messages"][-2]["role"] == "assistant"
    assert after["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_d",
        "content": "there are three",
    }
    [ended] = [e for e in events if isinstance(e, ChildEnded)]
    assert ended.answer == "there are three"


async def test_five_delegations_run_at_most_four_at_once(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    release = trio.Event()
    calls = [(f"call_{n}", "delegate", {"title": f"T{n}", "prompt": f"task {n}"}) for n in range(5)]
    provider.add(tool_call_reply(*calls))
    provider.add(*(held_text("child answer", release) for _ in range(5)))
    provider.add(text_reply("all done"))
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("fan out")
        running: list[int] = []

        async def read() -> None:
            async for event in run.events():
                if isinstance(event, ChildRunning):
                    running.append(len(lease.running_children))

        nursery.start_soon(read)
        with trio.fail_after(10):
            while len(provider.chat_requests()) < 1 + MAX_RUNNING_CHILDREN:
                await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        # Four children ask their model; the fifth waits for a place, not yet running.
        assert len(provider.chat_requests()) == 1 + MAX_RUNNING_CHILDREN
        assert len(lease.running_children) == MAX_RUNNING_CHILDREN
        release.set()
        assert (await run.wait()).state is RunState.COMPLETED
        await lease.release(close=False)
    assert len(running) == 5
    assert max(running) <= MAX_RUNNING_CHILDREN
    requests = [r.body for r in provider.chat_requests()]
    assert len(requests) == 7
    results = [m for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [f"call_{n}" for n in range(5)]
    assert {m["content"] for m in results} == {"child answer"}
