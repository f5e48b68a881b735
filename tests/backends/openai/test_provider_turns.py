"""The provider backend driven through the real runtime (AgentService over a real SQLite file)
against a real loopback HTTP server, through the real ``openai`` SDK: streaming text and
reasoning, usage, tool calls assembled from fragments, permissions, files, stop reasons."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from loopback import (
    LoopbackProvider,
    Reply,
    chunk,
    text_reply,
    tool_call_reply,
    usage_chunk,
)
from provider_support import TEST_KEY, answering, one_turn, open_lease

from maple_acp.model import ItemKind, ToolStatus
from maple_acp.runtime import (
    MAX_PLAN_MARKDOWN_CHARS,
    MAX_READ_CHARS,
    AgentService,
    ContextUsage,
    CycleStarted,
    GoalChanged,
    GoalStatus,
    PermissionRequest,
    PlanUpdated,
    RunEvent,
    RunState,
    TextChunk,
    ThoughtChunk,
    ToolRow,
    UsageUpdate,
)
from maple_acp.testing.demo import collect_events, run_prompt


def text_of(events: list[RunEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextChunk))


def rows(events: list[RunEvent], tool_id: str | None = None) -> list[ToolRow]:
    return [
        e for e in events if isinstance(e, ToolRow) and (tool_id is None or e.tool_id == tool_id)
    ]


async def test_a_streamed_answer_reaches_the_caller_with_usage_and_the_key(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    reply = text_reply("Hel", "lo", " there", usage=None)
    assert reply.events is not None
    reply.events.append(usage_chunk(12, 3, cached=4))
    provider.add(reply)
    events, outcome = await one_turn(service, project, "say hello")
    assert outcome.state is RunState.COMPLETED
    assert text_of(events) == "Hello there"
    chunks = [e for e in events if isinstance(e, TextChunk)]
    assert len({c.message_id for c in chunks}) == 1
    assert outcome.usage.input_tokens == 12
    assert outcome.usage.output_tokens == 3
    assert outcome.usage.total_tokens == 15
    assert outcome.usage.cache_read_tokens == 4
    (request,) = provider.chat_requests()
    assert request.headers["authorization"] == f"Bearer {TEST_KEY}"
    body = request.body
    assert body["model"] == "test-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][-1] == {"role": "user", "content": "say hello"}
    native = {"shell", "shell_output", "shell_kill", "read_file", "write_file", "edit_file"}
    native |= {"update_plan", "delegate"}
    assert {tool["function"]["name"] for tool in body["tools"]} == native


async def test_reasoning_fields_become_thoughts(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        Reply(
            events=[
                chunk(reasoning_content="think "),
                chunk(reasoning="more"),
                chunk(content="answer"),
                chunk(finish_reason="stop"),
            ]
        )
    )
    events, outcome = await one_turn(service, project, "why")
    assert outcome.state is RunState.COMPLETED
    thoughts = [e for e in events if isinstance(e, ThoughtChunk)]
    assert "".join(t.text for t in thoughts) == "think more"
    assert text_of(events) == "answer"


async def test_several_split_tool_calls_run_and_their_results_go_back(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "a.txt").write_text("alpha\n")
    (project / "b.txt").write_text("beta\n")
    provider.add(
        tool_call_reply(
            ("call_a", "read_file", {"path": "a.txt"}),
            ("call_b", "read_file", {"path": "b.txt"}),
            text="Reading both.",
        ),
        text_reply("done"),
    )
    events, outcome = await one_turn(service, project, "read them")
    assert outcome.state is RunState.COMPLETED
    assert not [e for e in events if isinstance(e, PermissionRequest)]
    finals = [r.tool for r in rows(events) if r.tool.status.terminal]
    assert [t.output_text for t in finals] == ["alpha\n", "beta\n"]
    assert finals[0].locations[0].path == str((project / "a.txt").resolve())
    second = provider.chat_requests()[1].body["messages"]
    assistant = second[-3]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "Reading both."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_a", "call_b"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"path": "a.txt"}
    assert second[-2] == {"role": "tool", "tool_call_id": "call_a", "content": "alpha\n"}
    assert second[-1] == {"role": "tool", "tool_call_id": "call_b", "content": "beta\n"}
    # Usage of both requests is summed for the turn.
    assert outcome.usage.input_tokens == 30
    assert [e.usage.input_tokens for e in events if isinstance(e, UsageUpdate)] == [20, 30]


async def test_shell_asks_and_runs_when_allowed(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        tool_call_reply(("c1", "shell", {"command": "echo from-shell > out.txt; echo ok"})),
        text_reply("ran it"),
    )
    events, outcome = await one_turn(service, project, "run it", answer="allow_once")
    assert outcome.state is RunState.COMPLETED
    (ask,) = [e for e in events if isinstance(e, PermissionRequest)]
    assert ask.request.name == "shell"
    assert (project / "out.txt").read_text() == "from-shell\n"
    result = provider.chat_requests()[1].body["messages"][-1]
    assert result["content"] == "exit code 0\nok\n"


async def test_shell_denied_never_runs_and_the_model_is_told(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        tool_call_reply(("c1", "shell", {"command": "touch ran.txt"})),
        text_reply("ok, I will not"),
    )
    events, outcome = await one_turn(service, project, "run it", answer="deny_once")
    assert outcome.state is RunState.COMPLETED
    assert not (project / "ran.txt").exists()
    final = rows(events)[-1].tool
    assert final.status is ToolStatus.FAILED
    assert final.output_text == "permission denied"
    assert provider.chat_requests()[1].body["messages"][-1]["content"] == (
        "the user denied this tool call"
    )
    assert text_of(events) == "ok, I will not"


async def test_write_file_shows_its_diff_before_asking_and_writes_when_allowed(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "f.txt").write_text("old\n")
    provider.add(
        tool_call_reply(("w", "write_file", {"path": "f.txt", "content": "new\n"})),
        tool_call_reply(("e", "edit_file", {"path": "f.txt", "old_text": "new", "new_text": "z"})),
        text_reply("edited"),
    )
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("change it")
        events: list[RunEvent] = []
        async for event in run.events():
            events.append(event)
            if isinstance(event, PermissionRequest):
                # When asked, the row already carries the diff and the file is unchanged.
                shown = rows(events)[-1].tool
                assert shown.diffs
                assert shown.diffs[0].new_text in ("new\n", "z\n")
                assert (project / "f.txt").read_text() in ("old\n", "new\n")
                event.responder.answer("allow_once")
        outcome = await run.wait()
        history = await lease.history()
        await lease.release(close=False)
    assert outcome.state is RunState.COMPLETED
    assert (project / "f.txt").read_text() == "z\n"
    write_final = [r.tool for r in rows(events) if r.tool.name == "write_file"][-1]
    assert write_final.status is ToolStatus.COMPLETED
    real = str((project / "f.txt").resolve())
    assert (write_final.diffs[0].path, write_final.diffs[0].old_text) == (real, "old\n")
    tools = [item.tool for item in history if item.kind is ItemKind.TOOL]
    assert [t.diffs[0].new_text for t in tools if t is not None] == ["new\n", "z\n"]


async def test_a_path_escaping_the_root_is_a_failed_row_not_a_crash(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        tool_call_reply(("r", "read_file", {"path": "../../etc/passwd"})),
        tool_call_reply(("w", "write_file", {"path": "/tmp/evil.txt", "content": "x"})),
        tool_call_reply(("x", "no_such_tool", {})),
        Reply(
            events=[
                chunk(tool_calls=[{"index": 0, "id": "bad", "function": {"name": "read_file"}}]),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": "{not json"}}]),
                chunk(finish_reason="tool_calls"),
            ]
        ),
        text_reply("sorry"),
    )
    events, outcome = await one_turn(service, project, "escape", answer="allow_once")
    assert outcome.state is RunState.COMPLETED
    assert not [e for e in events if isinstance(e, PermissionRequest)]
    finals = [r.tool for r in rows(events) if r.tool.status.terminal]
    assert all(t.status is ToolStatus.FAILED for t in finals)
    assert "outside the session's project directory" in (finals[0].output_text or "")
    assert "outside" in (finals[1].output_text or "")
    assert "no tool named" in (finals[2].output_text or "")
    assert "not valid JSON" in (finals[3].output_text or "")
    told = [r.body["messages"][-1]["content"] for r in provider.chat_requests()[1:]]
    assert all(text.startswith("error: ") for text in told)


async def test_the_next_turn_sees_the_whole_conversation(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "a.txt").write_text("alpha\n")
    provider.add(
        tool_call_reply(("c", "read_file", {"path": "a.txt"}), text="Let me look."),
        text_reply("It says alpha."),
        text_reply("Yes."),
    )
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        await run_prompt(lease, "what is in a.txt?")
        _, outcome = await run_prompt(lease, "sure?")
        await lease.release(close=False)
    assert outcome.state is RunState.COMPLETED
    messages = provider.chat_requests()[2].body["messages"]
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[1]["content"] == "what is in a.txt?"
    assert messages[2]["content"] == "Let me look."
    assert messages[2]["tool_calls"][0]["function"]["name"] == "read_file"
    assert messages[3]["content"] == "alpha\n"
    assert messages[3]["tool_call_id"] == messages[2]["tool_calls"][0]["id"]
    assert messages[4]["content"] == "It says alpha."
    assert messages[5]["content"] == "sure?"


async def test_length_and_content_filter_end_the_turn_at_once(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "a.txt").write_text("a")
    cut_tool = tool_call_reply(("c", "read_file", {"path": "a.txt"}))
    cut_tool.events[-2] = chunk(finish_reason="length")
    provider.add(cut_tool, text_reply("", finish="content_filter"))
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        first_events, first = await run_prompt(lease, "long")
        _, second = await run_prompt(lease, "bad")
        await lease.release(close=False)
    assert first.state is RunState.COMPLETED
    assert second.state is RunState.COMPLETED
    # A half-written tool call of a cut answer is not run, and no further request is made.
    assert not rows(first_events)
    assert len(provider.chat_requests()) == 2


async def test_stop_reasons_reach_the_outcome(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    from provider_support import provider_service

    (project / "a.txt").write_text("a")
    provider.add(
        text_reply("cut", finish="length"),
        text_reply("", finish="content_filter"),
        text_reply("fine"),
        *(tool_call_reply((f"c{i}", "read_file", {"path": "a.txt"})) for i in range(2)),
    )
    async with (
        provider_service(tmp_path, provider, max_turn_requests=2) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, project, nursery)
        reasons = []
        for prompt in ("long", "bad", "fine", "loop"):
            _, outcome = await run_prompt(lease, prompt)
            reasons.append(outcome.stop_reason.value)
        await lease.release(close=False)
    assert reasons == ["max_tokens", "refusal", "end_turn", "max_turn_requests"]


async def test_the_request_bound_ends_the_turn(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    from provider_support import provider_service

    (project / "a.txt").write_text("a")
    provider.add(*(tool_call_reply((f"c{i}", "read_file", {"path": "a.txt"})) for i in range(3)))
    async with provider_service(tmp_path, provider, max_turn_requests=2) as service:
        events, outcome = await one_turn(service, project, "loop")
    assert outcome.state is RunState.COMPLETED
    assert len(provider.chat_requests()) == 2
    # The tools of the last allowed answer are not run: nobody would read their results.
    assert len({r.tool_id for r in rows(events)}) == 1


async def test_context_usage_is_reported_when_the_window_is_known(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    from provider_support import provider_service

    provider.add(
        Reply(events=[chunk(content="hi"), chunk(finish_reason="stop"), usage_chunk(900, 100)])
    )
    async with provider_service(tmp_path, provider, context_window=8000) as service:
        events, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.COMPLETED
    reports = [e for e in events if isinstance(e, ContextUsage)]
    assert [(r.used, r.size) for r in reports] == [(1000, 8000)]


async def test_old_tool_outputs_are_dropped_to_fit_a_known_window(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    from provider_support import provider_service

    (project / "big.txt").write_text("B" * 4000)
    (project / "small.txt").write_text("s")
    provider.add(
        tool_call_reply(("c1", "read_file", {"path": "big.txt"})),
        tool_call_reply(("c2", "read_file", {"path": "small.txt"})),
        text_reply("done"),
    )
    async with provider_service(tmp_path, provider, context_window=1000) as service:
        _, outcome = await one_turn(service, project, "read both")
    assert outcome.state is RunState.COMPLETED
    second, third = (r.body["messages"] for r in provider.chat_requests()[1:])
    # While it is the latest message the big output is sent whole; then it gives way.
    assert second[-1]["content"] == "B" * 4000
    assert third[-3]["content"] == "[output dropped to fit the context window]"
    assert third[-1]["content"] == "s"
    assert third[0]["role"] == "system"
    assert third[1] == {"role": "user", "content": "read both"}


async def test_events_are_read_by_collect_events_too(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(text_reply("x"))
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("x")
        events = await collect_events(run)
        await lease.release(close=False)
    assert text_of(events) == "x"


@attrs.frozen
class Definition:
    name: str = "external_mcp"
    description: str = "Call a tool of the session's MCP servers."
    input_schema: dict[str, Any] = attrs.field(
        factory=lambda: {
            "type": "object",
            "properties": {"tool": {"type": "string", "enum": ["srv__ping"]}, "arguments": {}},
            "required": ["tool", "arguments"],
        }
    )


class EchoRouter:
    """The lease's external tool router as the runtime sees it (the real MCP router has its
    own tests; here only what the backend does with the one static tool matters)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.call_ids: list[str | None] = []

    def tool_definition(self) -> Definition:
        return Definition()

    async def call(
        self, tool_id: str, arguments: dict[str, Any], *, call_id: str | None = None
    ) -> dict[str, Any]:
        self.calls.append((tool_id, arguments))
        self.call_ids.append(call_id)
        return {"content": [{"type": "text", "text": "pong"}]}

    def revoke(self) -> None:
        pass


async def test_external_mcp_is_offered_asked_and_routed(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    router = EchoRouter()

    async def factory(nursery: trio.Nursery, task_id: str) -> EchoRouter:
        return router

    provider.add(
        tool_call_reply(("m", "external_mcp", {"tool": "srv__ping", "arguments": {"n": 1}})),
        text_reply("pong received"),
    )
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project), router_factory=factory, task_status=task_status
            )
        )
        run = await lease.start_run("ping")
        events = await answering(run, "allow_once")
        outcome = await run.wait()
        await lease.release(close=False)
    assert outcome.state is RunState.COMPLETED
    (ask,) = [e for e in events if isinstance(e, PermissionRequest)]
    assert ask.request.name == "external_mcp"
    assert router.calls == [("srv__ping", {"n": 1})]
    assert router.call_ids == [ask.request.tool_id]
    first = provider.chat_requests()[0].body
    offered = {tool["function"]["name"]: tool["function"] for tool in first["tools"]}
    assert offered["external_mcp"]["parameters"]["properties"]["tool"]["enum"] == ["srv__ping"]
    result = provider.chat_requests()[1].body["messages"][-1]["content"]
    assert json.loads(result) == {"content": [{"type": "text", "text": "pong"}]}


async def test_external_mcp_is_not_offered_without_servers(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        tool_call_reply(("m", "external_mcp", {"tool": "srv__ping", "arguments": {}})),
        text_reply("ok"),
    )
    events, _ = await one_turn(service, project, "ping")
    tools = {tool["function"]["name"] for tool in provider.chat_requests()[0].body["tools"]}
    assert "external_mcp" not in tools
    assert not [e for e in events if isinstance(e, PermissionRequest)]
    assert "no tool named 'external_mcp'" in (rows(events)[-1].tool.output_text or "")


async def test_goal_cycles_work_until_the_model_reports_the_goal_met(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        text_reply("Step one done.\nGOAL CONTINUE"),
        text_reply("All done.\nGOAL COMPLETE"),
    )
    statuses = []
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        session = lease.session_events()
        await lease.set_goal("tidy the project")
        async for event in session:
            if isinstance(event, CycleStarted):
                await collect_events(event.run)
            elif isinstance(event, GoalChanged) and event.goal is not None:
                statuses.append(event.goal.status)
                if event.goal.status is not GoalStatus.ACTIVE:
                    break
        await lease.release(close=False)
    assert statuses[-1] is GoalStatus.COMPLETE
    assert len(provider.chat_requests()) == 2
    first = provider.chat_requests()[0].body["messages"][-1]["content"]
    assert "tidy the project" in first
    assert "GOAL COMPLETE" in first


async def test_oversized_tool_arguments_fail_the_call_not_the_turn(
    service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from maple_acp.backends.openai import _stream
    from maple_acp.backends.provider import _tools as _native

    monkeypatch.setattr(_stream, "MAX_ARGUMENT_CHARS", 64)
    monkeypatch.setattr(_native, "MAX_ARGUMENT_CHARS", 64)
    provider.add(
        tool_call_reply(("big", "write_file", {"path": "x.txt", "content": "y" * 500}), pieces=10),
        text_reply("too big, sorry"),
    )
    events, outcome = await one_turn(service, project, "write a lot")
    assert outcome.state is RunState.COMPLETED
    final = rows(events)[-1].tool
    assert final.status is ToolStatus.FAILED
    assert final.output_text == "the arguments are too long"
    assert not (project / "x.txt").exists()
    sent = provider.chat_requests()[1].body["messages"]
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == "{}"


async def test_the_model_shows_its_plan(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    plan = {
        "entries": [
            {"content": "read the code", "status": "completed"},
            {"content": "fix the bug", "status": "in_progress", "priority": "high"},
        ]
    }
    provider.add(
        tool_call_reply(("p", "update_plan", plan)),
        tool_call_reply(("q", "update_plan", {"entries": [{"content": " "}]})),
        text_reply("planned"),
    )
    events, outcome = await one_turn(service, project, "plan it")
    assert outcome.state is RunState.COMPLETED
    (update,) = [e for e in events if isinstance(e, PlanUpdated)]
    entries = update.entries
    assert [(e.content, e.status.value, e.priority.value) for e in entries] == [
        ("read the code", "completed", "medium"),
        ("fix the bug", "in_progress", "high"),
    ]
    # A plan is no tool row; a call that cannot be one fails a row the user sees.
    shown = rows(events)
    assert {r.tool.name for r in shown} == {"update_plan"}
    assert shown[-1].tool.status is ToolStatus.FAILED
    assert shown[-1].tool.output_text == "every entry needs a non-blank content"
    results = [r.body["messages"][-1]["content"] for r in provider.chat_requests()[1:]]
    assert results == ["plan updated", "error: every entry needs a non-blank content"]


async def test_the_model_may_write_its_plan_as_markdown(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    markdown = "# Fix the bug\n\n1. read the code\n2. **fix** it"
    provider.add(tool_call_reply(("p", "update_plan", {"markdown": markdown})), text_reply("ok"))
    events, outcome = await one_turn(service, project, "plan it")
    assert outcome.state is RunState.COMPLETED
    (update,) = [e for e in events if isinstance(e, PlanUpdated)]
    assert (update.entries, update.markdown) == ((), markdown)
    assert not rows(events)
    assert provider.chat_requests()[1].body["messages"][-1]["content"] == "plan updated"


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (
            {"entries": [{"content": "a", "status": "pending"}], "markdown": "# a"},
            "give either entries or markdown, not both",
        ),
        ({}, "give the plan as entries or as markdown"),
        (
            {"markdown": "x" * (MAX_PLAN_MARKDOWN_CHARS + 1)},
            f"markdown is longer than {MAX_PLAN_MARKDOWN_CHARS} characters",
        ),
        (
            {"entries": [{"content": "s", "status": "pending"}] * 65},
            "entries must be a list of at most 64",
        ),
        ({"markdown": 7}, "markdown must be a string"),
    ],
)
async def test_a_plan_call_that_is_no_plan_fails_its_row(
    service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    arguments: dict[str, Any],
    reason: str,
) -> None:
    provider.add(tool_call_reply(("bad", "update_plan", arguments)), text_reply("sorry"))
    events, outcome = await one_turn(service, project, "plan it")
    assert outcome.state is RunState.COMPLETED
    assert not [e for e in events if isinstance(e, PlanUpdated)]
    final = rows(events)[-1].tool
    assert (final.name, final.status, final.output_text) == (
        "update_plan",
        ToolStatus.FAILED,
        reason,
    )
    assert provider.chat_requests()[1].body["messages"][-1]["content"] == f"error: {reason}"


async def relayed_turn(
    tmp_path: Path, provider: LoopbackProvider, project: Path, token: str, prompt: str
) -> list[RunEvent]:
    """One turn of ``prompt`` on a lease given ``MAPLE_TOKEN=token``, every ask allowed."""
    from provider_support import provider_service

    async with (
        provider_service(tmp_path, provider, relay_allow_list=("MAPLE_TOKEN",)) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project), relay={"MAPLE_TOKEN": token}, task_status=task_status
            )
        )
        run = await lease.start_run(prompt)
        events = await answering(run, "allow_once")
        await lease.release(close=False)
    return events


async def test_a_relay_value_printed_by_a_tool_never_reaches_the_provider(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    token = "relay-secret-5f4e3d2c1b"
    provider.add(
        tool_call_reply(("c", "shell", {"command": "echo token=$MAPLE_TOKEN"})),
        text_reply("seen"),
    )
    await relayed_turn(tmp_path, provider, project, token, "show it")
    told = provider.chat_requests()[1].body["messages"][-1]["content"]
    assert told == "exit code 0\ntoken=[relay:MAPLE_TOKEN]\n"
    assert all(token not in json.dumps(r.body) for r in provider.requests)


async def test_a_file_read_cut_inside_a_relay_value_leaves_no_piece_of_it(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    token = "relay-secret-5f4e3d2c1b-0a9b8c7d6e"
    # Short lines up to the read bound, then the value across it: the last kept line is the
    # start of the value, and reading from that line shows it.
    head = "line\n" * (MAX_READ_CHARS // 5 - 3)
    kept = MAX_READ_CHARS - len(head)
    (project / "big.txt").write_text(head + "x" * 3 + token + "\n")
    last_line = head.count("\n") + 1
    assert 8 <= kept - 3 < len(token)
    provider.add(
        tool_call_reply(("c", "read_file", {"path": "big.txt", "start_line": last_line})),
        text_reply("seen"),
    )
    events = await relayed_turn(tmp_path, provider, project, token, "read it")
    told = provider.chat_requests()[1].body["messages"][-1]["content"]
    assert told.startswith("xxx")
    assert "the file goes on" in told
    piece = token[:8]
    assert all(piece not in json.dumps(r.body) for r in provider.requests)
    assert all(piece not in (row.tool.output_text or "") for row in rows(events))


async def test_tool_calls_without_ids_get_unique_ones(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "a.txt").write_text("a")
    anonymous = Reply(
        events=[
            chunk(tool_calls=[{"index": 0, "function": {"name": "read_file", "arguments": ""}}]),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"path": "a.txt"}'}}]),
            chunk(finish_reason="tool_calls"),
        ]
    )
    provider.add(anonymous, attrs.evolve(anonymous), text_reply("ok"))
    _, outcome = await one_turn(service, project, "read twice")
    assert outcome.state is RunState.COMPLETED
    messages = provider.chat_requests()[2].body["messages"]
    ids = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
    results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert len(set(ids)) == 2
    assert results == ids


async def test_read_file_pages_through_a_long_file(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 3001)))
    provider.add(
        tool_call_reply(("a", "read_file", {"path": "long.txt"})),
        tool_call_reply(("b", "read_file", {"path": "long.txt", "start_line": 2999})),
        tool_call_reply(("c", "read_file", {"path": "long.txt", "start_line": 0})),
        text_reply("read"),
    )
    events, _ = await one_turn(service, project, "read it")
    first, second, third = (r.body["messages"][-1]["content"] for r in provider.chat_requests()[1:])
    assert first.startswith("line 1\n")
    assert first.endswith("line 2000\n\n[lines 1-2000 of 3000; pass start_line to read on]")
    assert second == "line 2999\nline 3000\n\n[lines 2999-3000 of 3000; pass start_line to read on]"
    assert third == "error: start_line must be a whole number from 1"
    located = [r.tool.locations for r in rows(events) if r.tool.status.terminal][1]
    assert located[0].line == 2999


async def test_ambient_sdk_settings_do_not_reach_the_configured_endpoint(
    service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "Authorization: Bearer other\nX-Team: blue")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-elsewhere")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-elsewhere")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    provider.add(text_reply("here"))
    _, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.COMPLETED
    headers = provider.chat_requests()[0].headers
    assert headers["authorization"] == f"Bearer {TEST_KEY}"
    assert "x-team" not in headers
    assert "openai-organization" not in headers
    assert "openai-project" not in headers
