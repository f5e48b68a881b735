"""The provider engines' shell tool: a failed command's row says its exit code in its text
(the row a client shows), and the model is told it too."""

from __future__ import annotations

from pathlib import Path

from loopback import LoopbackProvider, text_reply, tool_call_reply
from provider_support import one_turn

from maple_acp.model import ToolStatus
from maple_acp.runtime import AgentService, RunState, ToolRow


async def test_a_failed_shell_call_says_its_exit_code_in_its_row_text(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        tool_call_reply(("c1", "shell", {"command": "echo oops; exit 5"})),
        text_reply("it failed"),
    )
    events, outcome = await one_turn(service, project, "run it", answer="allow_once")
    assert outcome.state is RunState.COMPLETED
    (final,) = [e.tool for e in events if isinstance(e, ToolRow) and e.tool.status.terminal]
    assert final.status is ToolStatus.FAILED
    assert final.output_text == "exit code 5\noops\n"
    assert final.raw_output is not None
    assert final.raw_output["exitCode"] == 5
    assert provider.chat_requests()[1].body["messages"][-1]["content"] == "exit code 5\noops\n"
