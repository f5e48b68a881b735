"""The foundation's ``delegate`` tool through the Anthropic Messages engine: the model's call
runs a child session whose request offers no ``delegate``, and the parent's next request
carries the child's answer as the tool result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from anthropic_support import messages_service
from messages_loopback import MessagesProvider, text_reply, tool_reply

from maple_acp.runtime import RunState
from maple_acp.testing.demo import run_prompt


def names(body: Any) -> list[str]:
    return [tool["name"] for tool in body.get("tools", [])]


async def test_a_delegate_call_runs_a_child_and_returns_its_answer(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(
        tool_reply(("toolu_d", "delegate", {"title": "Count", "prompt": "count the files"})),
        text_reply("there are ", "three"),
        text_reply("done"),
    )
    async with (
        messages_service(tmp_path, messages_provider) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(service.serve_new_task, str(project))
        _, outcome = await run_prompt(lease, "ask a helper")
        assert outcome.state is RunState.COMPLETED
        await lease.release(close=False)
    parent, child, after = (r.body for r in messages_provider.message_requests())
    assert "delegate" in names(parent)
    assert "shell" in names(child)
    assert "delegate" not in names(child)
    assert [m["role"] for m in child["messages"]] == ["user"]
    results = [
        block
        for block in after["messages"][-1]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert len(results) == 1
    assert results[0]["tool_use_id"] == "toolu_d"
    content = results[0]["content"]
    text = content if isinstance(content, str) else "".join(b["text"] for b in content)
    assert text == "there are three"
