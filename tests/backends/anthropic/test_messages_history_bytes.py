"""The same history, byte for byte, on the Messages engine: every request of a session carries
what an earlier request sent, unchanged, before its new messages (tool results with their exit
code under the provider's tool-use id, thinking with its signature, the model's own input). The
one difference allowed is where the prompt-cache breakpoint sits: it marks the latest message,
and the provider reads the prefix before it from its cache. Checked on the bytes the loopback
server read."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import trio
from anthropic_support import messages_service
from messages_loopback import (
    MessagesProvider,
    Reply,
    message_end,
    message_start,
    text_block,
    text_reply,
    thinking_block,
    tool_use_block,
)

from maple_acp.runtime import PermissionRequest, RunState

SIGNATURE = "c2lnbmVkIHRoaW5raW5nIGJsb2Nr"
#: The breakpoint marker as the client serializes it, with the separator before it.
BREAKPOINT = re.compile(r',\s*"cache_control":\s*\{"type":\s*"ephemeral"\}')


def raw_members(body: bytes, key: str) -> list[str]:
    """The members of the top-level array ``key``, each as the exact text the client sent,
    without the breakpoint marker."""
    text = body.decode()
    decoder = json.JSONDecoder()
    position = text.index("[", text.index(f'"{key}"') + len(key) + 2) + 1
    members = []
    while True:
        while text[position] in " \n\r\t,":
            position += 1
        if text[position] == "]":
            return members
        _, end = decoder.raw_decode(text, position)
        members.append(BREAKPOINT.sub("", text[position:end]))
        position = end


def shell_answer() -> Reply:
    """Signed thinking, then a shell call whose input the model spaced its own way."""
    events = [message_start(20), *thinking_block(0, "I should run it.", SIGNATURE)]
    events.extend(tool_use_block(1, "toolu_01Abc", "shell", {"command": "echo  hi"}))
    return Reply(events=[*events, *message_end("tool_use", 10)])


def text_then_read() -> Reply:
    events = [message_start(20), *text_block(0, "Reading.")]
    events.extend(tool_use_block(1, "toolu_02Def", "read_file", {"path": "notes.txt"}))
    return Reply(events=[*events, *message_end("tool_use", 10)])


async def test_later_requests_carry_earlier_ones_byte_for_byte(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    (project / "notes.txt").write_text("alpha\n")
    messages_provider.add(
        shell_answer(), text_then_read(), text_reply("It says alpha."), text_reply("Yes.")
    )
    states = []
    async with (
        messages_service(tmp_path, messages_provider) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(service.serve_new_task, str(project))
        with trio.fail_after(30):
            for text in ("look", "again?"):
                run = await lease.start_run(text)
                async for event in run.events():
                    if isinstance(event, PermissionRequest):
                        event.responder.answer("allow_once")
                states.append((await run.wait()).state)
        await lease.release(close=False)
    assert states == [RunState.COMPLETED] * 2
    requests = messages_provider.message_requests()
    assert len(requests) == 4
    for before, after in itertools.pairwise(requests):
        sent = raw_members(before.raw_body, "messages")
        again = raw_members(after.raw_body, "messages")
        assert len(again) > len(sent)
        assert again[: len(sent)] == sent
        assert raw_members(after.raw_body, "tools") == raw_members(before.raw_body, "tools")
    later = [json.loads(member) for member in raw_members(requests[-1].raw_body, "messages")]
    assert later[1]["content"][0] == {
        "type": "thinking",
        "thinking": "I should run it.",
        "signature": SIGNATURE,
    }
    assert later[1]["content"][1]["id"] == "toolu_01Abc"
    assert later[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_01Abc",
        "content": "exit code 0\nhi\n",
    }
