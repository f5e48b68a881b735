"""Compaction in the Anthropic engine, against the loopback Messages server through the real
SDK: a request reaching 85 % of a known window first asks the model for a summary of the older
part (a Messages request with no tools, no thinking and ``max_tokens`` bounded, tool blocks
told as text), stored where it happened; that request and later turns carry summary + recent
turns; ``/compact`` forces one, says when there is nothing to compact, and a failed summary
stores nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from anthropic_support import messages_service
from messages_loopback import MessagesProvider, Reply, text_reply, tool_reply

from maple_acp.backends.provider import (
    NOTHING_TO_COMPACT,
    SUMMARY_MAX_TOKENS,
    SUMMARY_PREFIX,
    SUMMARY_REQUEST,
)
from maple_acp.model import ItemKind
from maple_acp.runtime import (
    AgentService,
    CompactionChanged,
    CompactionText,
    RunEvent,
    RunNotice,
    SessionLease,
    TextChunk,
)
from maple_acp.testing.demo import run_prompt

WINDOW = 1000
#: Two messages of about 250 tokens each, then a prompt of about 350: past 85 % of 1,000 with
#: the system prompt, while the first request stays far below it.
FIRST_PROMPT, FIRST_ANSWER, SECOND_PROMPT = "u" * 1000, "a" * 1000, "v" * 1400
SUMMARY = "the user sent u's; the agent answered a's"


def texts(body: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Each message's role and its blocks, a text block by its text, any other by its type."""
    return [
        (
            message["role"],
            [
                block["text"] if block["type"] == "text" else block["type"]
                for block in message["content"]
            ],
        )
        for message in body["messages"]
    ]


def compaction_events(events: list[RunEvent]) -> list[Any]:
    return [e for e in events if isinstance(e, (CompactionChanged, CompactionText))]


async def new_lease(service: AgentService, project: Path, nursery: trio.Nursery) -> SessionLease:
    lease: SessionLease = await nursery.start(service.serve_new_task, str(project))
    return lease


async def test_a_request_past_85_percent_is_compacted_and_later_turns_carry_the_summary(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(
        text_reply(FIRST_ANSWER),
        text_reply("the user sent u's; ", "the agent answered a's"),
        text_reply("second answer"),
        text_reply("third answer"),
    )
    with trio.fail_after(30):
        async with (
            messages_service(tmp_path, messages_provider, context_window=WINDOW) as service,
            trio.open_nursery() as nursery,
        ):
            lease = await new_lease(service, project, nursery)
            first, _ = await run_prompt(lease, FIRST_PROMPT)
            second, _ = await run_prompt(lease, SECOND_PROMPT)
            third, _ = await run_prompt(lease, "third")
            history = await service.store.history(lease.task_id)
            await lease.release()

    assert compaction_events(first) == []
    [started, *pieces, ended] = compaction_events(second)
    assert isinstance(started, CompactionChanged)
    assert started.status == "in_progress"
    assert "".join(p.text for p in pieces if isinstance(p, CompactionText)) == SUMMARY
    assert ended == CompactionChanged(started.run_id, started.compaction_id, "completed")
    # The summary is the compaction's, not the agent's answer.
    assert "".join(e.text for e in second if isinstance(e, TextChunk)) == "second answer"
    assert compaction_events(third) == []

    bodies = [request.body for request in messages_provider.message_requests()]
    assert len(bodies) == 4
    # The summary request: the older part, then the question; no tools, bounded.
    assert texts(bodies[1]) == [
        ("user", [FIRST_PROMPT]),
        ("assistant", [FIRST_ANSWER]),
        ("user", [SUMMARY_REQUEST]),
    ]
    assert "tools" not in bodies[1]
    assert bodies[1]["max_tokens"] == SUMMARY_MAX_TOKENS
    assert bodies[0]["max_tokens"] > SUMMARY_MAX_TOKENS
    # The request it made room for: the summary joined to the recent turn's user message.
    assert texts(bodies[2]) == [("user", [SUMMARY_PREFIX + SUMMARY, SECOND_PROMPT])]
    assert "tools" in bodies[2]
    # A later turn is built from the stored compaction the same way.
    assert texts(bodies[3]) == [
        ("user", [SUMMARY_PREFIX + SUMMARY, SECOND_PROMPT]),
        ("assistant", ["second answer"]),
        ("user", ["third"]),
    ]
    kinds = [(item.kind, item.text) for item in history]
    assert kinds == [
        (ItemKind.USER, FIRST_PROMPT),
        (ItemKind.ASSISTANT, FIRST_ANSWER),
        (ItemKind.USER, SECOND_PROMPT),
        (ItemKind.COMPACTION, SUMMARY),
        (ItemKind.ASSISTANT, "second answer"),
        (ItemKind.USER, "third"),
        (ItemKind.ASSISTANT, "third answer"),
    ]


async def test_tool_blocks_are_summarized_as_text_and_never_split_from_their_results(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    (project / "a.txt").write_text("alpha\n")
    messages_provider.add(
        tool_reply(("toolu_1", "read_file", {"path": "a.txt"}), text="Looking."),
        text_reply("It says alpha."),
        text_reply("summary of the reading"),
        text_reply("after"),
    )
    with trio.fail_after(30):
        async with (
            messages_service(tmp_path, messages_provider) as service,
            trio.open_nursery() as nursery,
        ):
            lease = await new_lease(service, project, nursery)
            await run_prompt(lease, "read a.txt")
            compacted, _ = await run_prompt(lease, "/compact")
            await run_prompt(lease, "go on")
            await lease.release()

    assert compaction_events(compacted)[-1].status == "completed"
    bodies = [request.body for request in messages_provider.message_requests()]
    assert len(bodies) == 4
    # The tool loop itself carries real tool blocks.
    assert texts(bodies[1])[1:] == [
        ("assistant", ["Looking.", "tool_use"]),
        ("user", ["tool_result"]),
    ]
    # The summary request (no tools offered) tells them as text, in the same order.
    [asked, called, result, answered, question] = texts(bodies[2])
    assert asked == ("user", ["read a.txt"])
    assert called == ("assistant", ["Looking.", '[tool call read_file: {"path":"a.txt"}]'])
    assert result == ("user", ["[tool result: alpha\n]"])
    assert answered == ("assistant", ["It says alpha."])
    assert question == ("user", [SUMMARY_REQUEST])
    assert "tools" not in bodies[2]
    assert all(
        block["type"] in ("text", "image")
        for message in bodies[2]["messages"]
        for block in message["content"]
    )
    assert texts(bodies[3]) == [("user", [SUMMARY_PREFIX + "summary of the reading", "go on"])]


async def test_compact_says_when_there_is_nothing_and_a_failed_summary_stores_nothing(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(
        text_reply("hello"),
        Reply(status=400, body={"type": "error", "error": {"type": "invalid_request_error"}}),
        text_reply("short summary"),
        text_reply("after"),
    )
    with trio.fail_after(30):
        async with (
            messages_service(tmp_path, messages_provider) as service,
            trio.open_nursery() as nursery,
        ):
            lease = await new_lease(service, project, nursery)
            assert [c.name for c in lease.commands] == ["compact"]
            await lease.set_thought_level("high")
            nothing, _ = await run_prompt(lease, "/compact")
            await run_prompt(lease, "hi")
            failed, _ = await run_prompt(lease, "/compact")
            forced, _ = await run_prompt(lease, "/compact")
            await run_prompt(lease, "go on")
            history = await service.store.history(lease.task_id)
            await lease.release()

    # Nothing older yet: no request, no compaction, and the user is told.
    assert compaction_events(nothing) == []
    assert [e.text for e in nothing if isinstance(e, RunNotice)] == [NOTHING_TO_COMPACT]
    [_, failure] = compaction_events(failed)
    assert isinstance(failure, CompactionChanged)
    assert failure.status == "failed"
    assert failure.error
    [_, _, completed] = compaction_events(forced)
    assert completed.status == "completed"
    assert [item.text for item in history if item.kind is ItemKind.COMPACTION] == ["short summary"]

    bodies = [request.body for request in messages_provider.message_requests()]
    assert len(bodies) == 4
    # The agent's requests think at the chosen level; a summary neither thinks nor runs long.
    assert "thinking" in bodies[0]
    for summary in bodies[1:3]:
        assert texts(summary) == [
            ("user", ["hi"]),
            ("assistant", ["hello"]),
            ("user", [SUMMARY_REQUEST]),
        ]
        assert "thinking" not in summary
        assert summary["max_tokens"] == SUMMARY_MAX_TOKENS
    # After it: the summary, and no /compact command goes to the model.
    assert texts(bodies[3]) == [("user", [SUMMARY_PREFIX + "short summary", "go on"])]
