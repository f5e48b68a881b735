"""Plan operations on the wire: a v1 client that declared ``clientCapabilities.plan`` and
every v2 client get ``plan_update`` (a checklist or Markdown, one ``planId``, replaced whole)
and ``plan_removed`` once a plan they hold is cleared; any other v1 client keeps the legacy
``plan`` update, a Markdown plan shown as the checklist of its list items. Load and resume replay
the last plan in the form the client takes. Every frame is validated against the negotiated
version's schema; plan operations against its unstable file, the only one that defines them in
v1 1.29 (and Markdown and removal in v2 alpha.12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from edge_harness import Harness, running_service
from test_acp_v2 import v2_client, wait_idle

from maple_acp.edge import AcpServiceConfig
from maple_acp.edge._projection import markdown_checklist
from maple_acp.runtime import MAX_PLAN_ENTRIES
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import (
    OUTBOUND_DEFINITIONS,
    V2_OUTBOUND_DEFINITIONS,
    AcpSchema,
    SchemaViolation,
)

#: The update kinds of plan operations.
PLAN_OPERATIONS = frozenset({"plan_update", "plan_removed"})
#: A checklist, then Markdown (``\n`` written as the two characters the demo reads), then an
#: empty plan, then another empty one (the client holds no plan any more).
SCRIPT = (
    "/plan [x] read the code; [>] fix the bug; test it",
    "/plan-md # Fix the bug\\n\\n- **read** it\\n- fix it",
    "/plan",
    "/plan",
)
MARKDOWN = "# Fix the bug\n\n- **read** it\n- fix it"
CHECKLIST = [
    {"content": "read the code", "priority": "medium", "status": "completed"},
    {"content": "fix the bug", "priority": "medium", "status": "in_progress"},
    {"content": "test it", "priority": "medium", "status": "pending"},
]

#: The Markdown plan as a legacy client sees it: one pending entry per list item.
MARKDOWN_AS_CHECKLIST = [
    {"content": "**read** it", "priority": "medium", "status": "pending"},
    {"content": "fix it", "priority": "medium", "status": "pending"},
]


class PlanOperationsSchema(AcpSchema):
    """The negotiated version's schema, reading plan operations from its unstable file."""

    def validate_outbound(self, method: str, params: Any) -> None:
        kind = params.get("update", {}).get("sessionUpdate") if method == "session/update" else None
        if kind not in PLAN_OPERATIONS:
            super().validate_outbound(method, params)
            return
        table = V2_OUTBOUND_DEFINITIONS if self.version == 2 else OUTBOUND_DEFINITIONS
        self.validate(table[method], params, unstable=True)


def plan_updates(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    return [u for u in client.updates(sid) if u["sessionUpdate"] in {"plan", *PLAN_OPERATIONS}]


def expect_operations(updates: list[dict[str, Any]]) -> None:
    """The script as plan operations: the checklist, the Markdown, one removal."""
    assert [u["sessionUpdate"] for u in updates] == ["plan_update", "plan_update", "plan_removed"]
    items, markdown, removed = updates
    assert items["plan"] == {"type": "items", "planId": "plan", "entries": CHECKLIST}
    assert markdown["plan"] == {"type": "markdown", "planId": "plan", "content": MARKDOWN}
    assert removed["planId"] == "plan"


@pytest.fixture
async def harness(tmp_path: Path) -> Any:
    config = AcpServiceConfig(protocol_max=2)
    async with running_service(tmp_path, config=config) as running:
        yield running


async def run_script(client: AcpTestClient, sid: str, *, v2: bool = False) -> None:
    for count, line in enumerate(SCRIPT, start=1):
        await client.prompt(sid, line)
        if v2:
            await wait_idle(client, sid, count)


async def test_a_v1_client_that_declared_plans_gets_plan_operations(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        await client.initialize(clientCapabilities={"plan": {}})
        sid = (await client.new_session(str(project)))["sessionId"]
        await run_script(client, sid)
        expect_operations(plan_updates(client, sid))
        client.validate(PlanOperationsSchema(acp_schema.directory))
        # The stable 1.29 file does not know them: the unstable one is the one that judges.
        with pytest.raises(SchemaViolation):
            client.validate(acp_schema)


async def test_a_v1_client_without_the_capability_keeps_the_legacy_plan(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await run_script(client, sid)
        updates = plan_updates(client, sid)
        assert [u["sessionUpdate"] for u in updates] == ["plan"] * 4
        assert [u["entries"] for u in updates] == [
            CHECKLIST,
            MARKDOWN_AS_CHECKLIST,
            [],
            [],
        ]
        client.validate(acp_schema)


async def test_a_v2_client_gets_plan_operations(
    harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await run_script(client, sid, v2=True)
        expect_operations(plan_updates(client, sid))
        client.validate(acp_schema_v2)
        client.validate(PlanOperationsSchema(acp_schema_v2.directory))


async def write_plans(harness: Harness, project: Path, *lines: str) -> str:
    """A session whose history holds the plans ``lines`` send, closed again."""
    async with harness.connect(initialize=True) as client:
        sid: str = (await client.new_session(str(project)))["sessionId"]
        for line in lines:
            await client.prompt(sid, line)
        await client.call("session/close", {"sessionId": sid})
    return sid


async def test_load_replays_the_last_plan_in_the_form_the_client_takes(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    sid = await write_plans(harness, project, SCRIPT[0], SCRIPT[1])
    async with harness.connect() as capable:
        await capable.initialize(clientCapabilities={"plan": {}})
        await capable.load_session(sid, str(project))
        [replayed] = plan_updates(capable, sid)
        assert replayed["plan"] == {"type": "markdown", "planId": "plan", "content": MARKDOWN}
        # The replayed plan is one the client holds: clearing it now removes it.
        await capable.prompt(sid, "/plan")
        assert [u["sessionUpdate"] for u in plan_updates(capable, sid)][-1] == "plan_removed"
        capable.validate(PlanOperationsSchema(acp_schema.directory))
        await capable.call("session/close", {"sessionId": sid})
    async with harness.connect(initialize=True) as legacy:
        await legacy.load_session(sid, str(project))
        # The last plan is the cleared one now: an empty legacy plan.
        assert [u.get("entries") for u in plan_updates(legacy, sid)] == [[]]
        legacy.validate(acp_schema)


async def test_load_of_a_markdown_plan_for_a_legacy_client_is_its_list_items(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    sid = await write_plans(harness, project, SCRIPT[1])
    async with harness.connect(initialize=True) as legacy:
        await legacy.load_session(sid, str(project))
        assert plan_updates(legacy, sid) == [
            {
                "sessionUpdate": "plan",
                "entries": MARKDOWN_AS_CHECKLIST,
            }
        ]
        legacy.validate(acp_schema)


async def test_a_cleared_plan_replays_nothing_to_a_client_of_plan_operations(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    sid = await write_plans(harness, project, SCRIPT[0], "/plan")
    async with harness.connect() as capable:
        await capable.initialize(clientCapabilities={"plan": {}})
        await capable.load_session(sid, str(project))
        assert plan_updates(capable, sid) == []
        # Nothing held, nothing to remove.
        await capable.prompt(sid, "/plan")
        assert plan_updates(capable, sid) == []
        capable.validate(PlanOperationsSchema(acp_schema.directory))


async def test_v2_resume_replays_the_last_plan(
    harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    sid = await write_plans(harness, project, SCRIPT[1], SCRIPT[0])
    async with v2_client(harness) as client:
        await client.call(
            "session/resume",
            {"sessionId": sid, "cwd": str(project), "replayFrom": {"type": "start"}},
        )
        [replayed] = plan_updates(client, sid)
        assert replayed["plan"] == {"type": "items", "planId": "plan", "entries": CHECKLIST}
        await client.prompt(sid, "/plan")
        await wait_idle(client, sid)
        assert [u["sessionUpdate"] for u in plan_updates(client, sid)] == [
            "plan_update",
            "plan_removed",
        ]
        client.validate(acp_schema_v2)
        client.validate(PlanOperationsSchema(acp_schema_v2.directory))


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        (
            "# Release\n\n1. [x] tag it\n2) [>] build it\n* [ ] ship it\n+ tell people",
            [
                ("tag it", "completed"),
                ("build it", "in_progress"),
                ("ship it", "pending"),
                ("tell people", "pending"),
            ],
        ),
        ("\n  # Only a heading\nand prose", [("# Only a heading", "pending")]),
        (
            "-no space is not an item\n- [?] an unknown box is text",
            [("[?] an unknown box is text", "pending")],
        ),
        ("", [("", "pending")]),
    ],
)
def test_a_markdown_plan_reads_as_a_checklist_of_its_list_items(
    markdown: str, expected: list[tuple[str, str]]
) -> None:
    entries = markdown_checklist(markdown)
    assert [(entry.content, entry.status.value) for entry in entries] == expected


def test_a_markdown_checklist_is_bounded_like_a_plan() -> None:
    entries = markdown_checklist("\n".join(f"- step {n}" for n in range(MAX_PLAN_ENTRIES + 50)))
    assert len(entries) == MAX_PLAN_ENTRIES
    assert entries[-1].content == f"step {MAX_PLAN_ENTRIES - 1}"
