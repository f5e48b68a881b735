"""A child's permission question seen by a v1 client that does not show child sessions: it is
asked with the delegate call's ``toolCallId``, so its ``toolCall`` (the child's tool: its
title, name, kind, ``pending``) is applied to the delegate row by a client that merges the
fields it is sent, as ACP asks. Once answered, the row reads as the delegation again
(``in_progress``, its title, name and kind), not as a question still waiting, for as long
as the child goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient, PermissionPolicy, allow, reject
from maple_acp.testing.schema import AcpSchema

TITLE = "Research"
#: A child whose one step is a shell call through its own permission question.
DELEGATE = f'/delegate {TITLE} :: /tool shell {{"command": "echo child"}}'


@pytest.fixture
async def harness(tmp_path: Path) -> Any:
    async with running_service(tmp_path, config=AcpServiceConfig()) as running:
        yield running


def row_states(client: AcpTestClient, tool_id: str) -> list[dict[str, Any]]:
    """The delegate row as the client holds it after each frame naming it, in arrival order:
    every field a ``tool_call``, a ``tool_call_update`` or a permission question's
    ``toolCall`` carries replaces the one held."""
    held: dict[str, Any] = {}
    states = []
    for message in client.inbound():
        if not isinstance(message, dict):
            continue
        params = message.get("params") or {}
        if message.get("method") == "session/update":
            fields = params["update"]
        elif message.get("method") == "session/request_permission":
            fields = params["toolCall"]
        else:
            continue
        if fields.get("toolCallId") != tool_id:
            continue
        held = {**held, **{k: v for k, v in fields.items() if k != "sessionUpdate"}}
        states.append(held)
    return states


@pytest.mark.parametrize("policy", [allow, reject], ids=["allowed", "rejected"])
async def test_the_delegate_row_reads_as_the_delegation_once_the_childs_question_is_answered(
    harness: Harness, project: Path, acp_schema: AcpSchema, policy: PermissionPolicy
) -> None:
    async with harness.connect(initialize=True, permission=policy) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, DELEGATE)
        assert answer["stopReason"] == "end_turn"
        client.validate(acp_schema)
    [asked] = client.permission_requests
    tool_id = asked["toolCall"]["toolCallId"]
    states = row_states(client, tool_id)
    # While the question waits, the row is the child's tool asking.
    waiting = next(s for s in states if s.get("status") == "pending")
    assert (waiting["title"], waiting["name"], waiting["kind"]) == (
        "shell: echo child",
        "shell",
        "execute",
    )
    # After it, and until the child's answer ends the call, the row is the delegation again.
    after_question = states[states.index(waiting) + 1 :]
    assert len(after_question) >= 2, after_question
    running, final = after_question[-2], after_question[-1]
    expected = (TITLE, "delegate", "other", "in_progress")
    assert (running["title"], running["name"], running["kind"], running["status"]) == expected
    assert running["rawInput"] == {
        "title": TITLE,
        "prompt": '/tool shell {"command": "echo child"}',
    }
    assert (final["title"], final["name"], final["status"]) == (TITLE, "delegate", "completed")
