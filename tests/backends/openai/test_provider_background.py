"""The model's background commands through the OpenAI-compatible engine (the Anthropic one
offers the same tools from the same foundation): ``shell`` with ``background: true`` answers
with a handle at once, ``shell_output`` reads what came since, ``shell_kill`` stops it, and
its row stays live past the turn."""

from __future__ import annotations

from pathlib import Path

import trio
from loopback import LoopbackProvider, text_reply, tool_call_reply
from provider_support import answering, open_lease

from maple_acp.runtime import AgentService, ToolRow, ToolStatus


async def test_the_model_starts_reads_and_kills_a_background_command(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    command = "echo hello-from-bg; exec sleep 60"
    provider.add(
        tool_call_reply(("c1", "shell", {"command": command, "background": True})),
        text_reply("started"),
        tool_call_reply(("c2", "shell_output", {"handle": "bg-1"})),
        text_reply("read"),
        tool_call_reply(("c3", "shell_kill", {"handle": "bg-1"})),
        text_reply("killed"),
        tool_call_reply(("c4", "shell_output", {"handle": "bg-9"})),
        text_reply("no such"),
    )
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        events = await answering(await lease.start_run("serve it"), "allow_once")
        rows = [e.tool for e in events if isinstance(e, ToolRow)]
        # The turn ended, the command's row did not.
        assert rows[-1].status is ToolStatus.IN_PROGRESS
        assert rows[-1].output_text == "bg-1"
        told = provider.chat_requests()[1].body["messages"][-1]["content"]
        assert told.startswith("started bg-1 in the background")
        background = lease.tools.background
        assert background is not None
        with trio.fail_after(10):
            while "hello-from-bg" not in background.read("bg-1"):  # noqa: ASYNC110
                await trio.sleep(0.01)
        # What came was read above: the model is told there is nothing new.
        await answering(await lease.start_run("look"), "allow_once")
        told = provider.chat_requests()[3].body["messages"][-1]["content"]
        assert told == "bg-1 is running; no new output"
        await answering(await lease.start_run("stop it"), "allow_once")
        assert provider.chat_requests()[5].body["messages"][-1]["content"] == "stopping bg-1"
        with trio.fail_after(10):
            while lease.background_commands()[0].status == "running":  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert lease.background_commands()[0].exit_code == -15
        await answering(await lease.start_run("again"), "allow_once")
        told = provider.chat_requests()[7].body["messages"][-1]["content"]
        assert told.startswith("error: no background command 'bg-9'")
        history = await lease.history()
        (ended,) = [
            item.tool
            for item in history
            if item.tool is not None
            and isinstance(item.tool.raw_output, dict)
            and item.tool.raw_output.get("handle") == "bg-1"
        ]
        assert ended.status is ToolStatus.FAILED
        assert ended.output_text == "killed by SIGTERM\nhello-from-bg\n"
        await lease.release(close=True)
