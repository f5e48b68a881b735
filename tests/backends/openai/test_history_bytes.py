"""The same history, byte for byte: every request of a session carries what an earlier request
sent, unchanged, before its new messages. Tool results keep their exit code, the provider's
call id and its argument text in later turns, so the model loses nothing and every provider's
prompt cache still matches. Checked on the bytes the loopback server read."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import trio
from loopback import LoopbackProvider, Recorded, text_reply, tool_call_reply
from provider_support import open_lease

from maple_acp.runtime import AgentService, PermissionRequest, RunState


def raw_members(body: bytes, key: str) -> list[str]:
    """The members of the top-level array ``key`` of a JSON body, each as the exact text the
    client sent."""
    text = body.decode()
    decoder = json.JSONDecoder()
    position = text.index(f'"{key}"') + len(key) + 2
    position = text.index("[", position) + 1
    members = []
    while True:
        while text[position] in " \n\r\t,":
            position += 1
        if text[position] == "]":
            return members
        _, end = decoder.raw_decode(text, position)
        members.append(text[position:end])
        position = end


def assert_prefixes(requests: list[Recorded]) -> None:
    """Each request's messages start with every message of the one before, byte for byte;
    the tools are the same bytes throughout."""
    for before, after in itertools.pairwise(requests):
        sent = raw_members(before.raw_body, "messages")
        again = raw_members(after.raw_body, "messages")
        assert len(again) > len(sent)
        assert again[: len(sent)] == sent
        assert raw_members(after.raw_body, "tools") == raw_members(before.raw_body, "tools")


async def prompt(lease: object, text: str) -> RunState:
    run = await lease.start_run(text)  # type: ignore[attr-defined]
    async for event in run.events():
        if isinstance(event, PermissionRequest):
            event.responder.answer("allow_once")
    return (await run.wait()).state  # type: ignore[no-any-return]


async def test_later_requests_carry_earlier_ones_byte_for_byte(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    (project / "notes.txt").write_text("alpha\n")
    provider.add(
        # Only a tool call, arguments spaced as this server spaces them.
        tool_call_reply(("call_Xy9", "shell", {"command": "echo  hi"})),
        # Text, a plan and a read in one answer.
        tool_call_reply(
            ("call_P1", "update_plan", {"entries": [{"content": "look", "status": "completed"}]}),
            ("call_R2", "read_file", {"path": "notes.txt"}),
            text="Reading.",
        ),
        text_reply("It says alpha."),
        text_reply("Yes."),
        text_reply("Sure."),
    )
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        with trio.fail_after(30):
            states = [await prompt(lease, text) for text in ("look", "again?", "and?")]
        await lease.release(close=False)
    assert states == [RunState.COMPLETED] * 3
    requests = provider.chat_requests()
    assert len(requests) == 5
    assert_prefixes(requests)
    later = raw_members(requests[-1].raw_body, "messages")
    # What the model saw of the shell call in its turn, still there two turns later.
    assert '"id":"call_Xy9"' in later[2]
    assert '{\\"command\\": \\"echo  hi\\"}' in later[2]
    assert json.loads(later[3]) == {
        "role": "tool",
        "tool_call_id": "call_Xy9",
        "content": "exit code 0\nhi\n",
    }
