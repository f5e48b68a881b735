"""Compaction in the provider backend, against the loopback provider through the real SDK: a
request reaching 85 % of a known window first asks the model for a summary of the older part,
which is stored where it happened, and that request and later turns' carry summary + recent
turns; ``/compact`` forces one; a failed summary stores nothing and the turn goes on; a
summary's output is bounded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from loopback import LoopbackProvider, Reply, text_reply
from provider_support import answering, open_lease, provider_service

from maple_acp.backends.openai._compaction import SUMMARY_MAX_TOKENS, SUMMARY_REQUEST
from maple_acp.backends.provider import SUMMARY_PREFIX
from maple_acp.model import ItemKind
from maple_acp.runtime import CompactionChanged, CompactionText, RunEvent, TextChunk

WINDOW = 1000
#: Two messages of about 250 tokens each, then a prompt of about 280: past 85 % of 1,000
#: with the system prompt, while the older part and the summary question fit the window.
FIRST_PROMPT, FIRST_ANSWER, SECOND_PROMPT = "u" * 1000, "a" * 1000, "v" * 1100


def contents(body: dict[str, Any]) -> list[Any]:
    return [message["content"] for message in body["messages"]]


def compaction_events(events: list[RunEvent]) -> list[Any]:
    return [e for e in events if isinstance(e, (CompactionChanged, CompactionText))]


async def test_a_request_past_85_percent_is_compacted_and_later_turns_carry_the_summary(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    provider.add(
        text_reply(FIRST_ANSWER),
        text_reply("the user sent u's; ", "the agent answered a's"),
        text_reply("second answer"),
        text_reply("third answer"),
    )
    async with (
        provider_service(tmp_path, provider, context_window=WINDOW) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, project, nursery)
        first = await answering(await lease.start_run(FIRST_PROMPT), "deny_once")
        assert compaction_events(first) == []
        second = await answering(await lease.start_run(SECOND_PROMPT), "deny_once")
        third = await answering(await lease.start_run("third"), "deny_once")
        history = await service.store.history(lease.task_id)
        await lease.release()

    [started, *pieces, ended] = compaction_events(second)
    assert isinstance(started, CompactionChanged)
    assert started.status == "in_progress"
    assert [p.text for p in pieces if isinstance(p, CompactionText)] == [
        "the user sent u's; ",
        "the agent answered a's",
    ]
    assert ended == CompactionChanged(started.run_id, started.compaction_id, "completed")
    # The summary is the compaction's, not the agent's answer.
    assert "".join(e.text for e in second if isinstance(e, TextChunk)) == "second answer"
    assert compaction_events(third) == []

    summary = "the user sent u's; the agent answered a's"
    bodies = [request.body for request in provider.chat_requests()]
    assert len(bodies) == 4
    # The summary request: the older part, then the question; no tools.
    assert contents(bodies[1])[1:] == [FIRST_PROMPT, FIRST_ANSWER, SUMMARY_REQUEST]
    assert "tools" not in bodies[1]
    # The request it made room for: summary + the recent turn.
    assert contents(bodies[2])[1:] == [SUMMARY_PREFIX + summary, SECOND_PROMPT]
    # A later turn is built from the stored compaction the same way.
    assert contents(bodies[3])[1:] == [
        SUMMARY_PREFIX + summary,
        SECOND_PROMPT,
        "second answer",
        "third",
    ]
    # The store keeps everything, the summary where it happened.
    kinds = [(item.kind, item.text) for item in history]
    assert kinds == [
        (ItemKind.USER, FIRST_PROMPT),
        (ItemKind.ASSISTANT, FIRST_ANSWER),
        (ItemKind.USER, SECOND_PROMPT),
        (ItemKind.COMPACTION, summary),
        (ItemKind.ASSISTANT, "second answer"),
        (ItemKind.USER, "third"),
        (ItemKind.ASSISTANT, "third answer"),
    ]


async def test_compact_forces_one_and_a_failed_summary_stores_nothing(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    provider.add(
        text_reply("hello"),
        Reply(status=400, body={"error": {"message": "no"}}),
        text_reply("short summary"),
        text_reply("after"),
    )
    async with (
        provider_service(tmp_path, provider) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await open_lease(service, project, nursery)
        assert [c.name for c in lease.commands] == ["compact"]
        nothing = await answering(await lease.start_run("/compact"), "deny_once")
        await answering(await lease.start_run("hi"), "deny_once")
        failed = await answering(await lease.start_run("/compact"), "deny_once")
        forced = await answering(await lease.start_run("/compact"), "deny_once")
        await answering(await lease.start_run("go on"), "deny_once")
        history = await service.store.history(lease.task_id)
        await lease.release()

    # Nothing older yet: no request, no compaction.
    assert compaction_events(nothing) == []
    [_, failure] = compaction_events(failed)
    assert isinstance(failure, CompactionChanged)
    assert failure.status == "failed"
    assert failure.error
    [_, _, completed] = compaction_events(forced)
    assert isinstance(completed, CompactionChanged)
    assert completed.status == "completed"
    assert [item.text for item in history if item.kind is ItemKind.COMPACTION] == ["short summary"]
    bodies = [request.body for request in provider.chat_requests()]
    assert contents(bodies[2])[1:] == ["hi", "hello", SUMMARY_REQUEST]
    # After it: the summary, and no /compact command goes to the model.
    assert contents(bodies[3])[1:] == [SUMMARY_PREFIX + "short summary", "go on"]


async def test_a_summary_is_bounded_so_a_model_that_rambles_cannot_hold_the_turn(
    tmp_path: Path, project: Path, provider: LoopbackProvider
) -> None:
    # The server writes until the request's max_tokens, or with none until the client goes
    # away: a small local model summarizing ran until the turn's timeout that way.
    provider.add(text_reply("hello"), Reply(rambling="la "), text_reply("after"))
    with trio.fail_after(20):
        async with (
            provider_service(tmp_path, provider) as service,
            trio.open_nursery() as nursery,
        ):
            lease = await open_lease(service, project, nursery)
            await answering(await lease.start_run("hi"), "deny_once")
            forced = await answering(await lease.start_run("/compact"), "deny_once")
            await answering(await lease.start_run("go on"), "deny_once")
            history = await service.store.history(lease.task_id)
            await lease.release()

    [_, *_, completed] = compaction_events(forced)
    assert isinstance(completed, CompactionChanged)
    assert completed.status == "completed"
    summary = "la " * SUMMARY_MAX_TOKENS
    assert [item.text for item in history if item.kind is ItemKind.COMPACTION] == [summary]
    bodies = [request.body for request in provider.chat_requests()]
    assert [body.get("max_tokens") for body in bodies] == [None, SUMMARY_MAX_TOKENS, None]
    assert contents(bodies[2])[1:] == [SUMMARY_PREFIX + summary, "go on"]
