"""Project trust before the first real prompt: form elicitation, the chooser, and fallbacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from edge_harness import Harness

from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError


@pytest.fixture
def skilled(project: Path) -> Path:
    skill = project / ".agents" / "skills" / "deploy"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("# deploy\n")
    return project


def _select(option: str) -> Any:
    return lambda params: {"outcome": {"outcome": "selected", "optionId": option}}


async def _trust(harness: Harness, root: Path) -> bool | None:
    return await harness.runtime.store.get_trust("demo-account", str(root))


async def test_chooser_trust(harness: Harness, skilled: Path, acp_schema: AcpSchema) -> None:
    async with harness.connect(permission=_select("trust")) as client:
        sid = (await client.new_session(str(skilled)))["sessionId"]
        # Never during session/new.
        assert client.permission_requests == []
        answer = await client.prompt(sid, "/echo go")
        assert answer["stopReason"] == "end_turn"
        assert client.text(sid) == "go"
        [question] = client.permission_requests
        assert [(o["optionId"], o["kind"]) for o in question["options"]] == [
            ("keep_disabled", "allow_once"),
            ("trust", "allow_once"),
            ("cancel_turn", "reject_once"),
        ]
        assert await _trust(harness, skilled) is True
        # Decided once per project: a second session does not ask again.
        other = (await client.new_session(str(skilled)))["sessionId"]
        await client.prompt(other, "again")
        assert len(client.permission_requests) == 1
        client.validate(acp_schema)


async def test_chooser_keep_disabled(harness: Harness, skilled: Path) -> None:
    async with harness.connect(permission=_select("keep_disabled")) as client:
        sid = (await client.new_session(str(skilled)))["sessionId"]
        assert (await client.prompt(sid, "/echo go"))["stopReason"] == "end_turn"
        assert await _trust(harness, skilled) is False


@pytest.mark.parametrize(
    "policy",
    [
        _select("cancel_turn"),
        lambda params: {"outcome": {"outcome": "cancelled"}},
        _select("allow_once"),
        lambda params: {"outcome": "nonsense"},
    ],
)
async def test_chooser_cancel_admits_nothing(harness: Harness, skilled: Path, policy: Any) -> None:
    async with harness.connect(permission=policy) as client:
        sid = (await client.new_session(str(skilled)))["sessionId"]
        answer = await client.prompt(sid, "/echo go")
        assert answer["stopReason"] == "cancelled"
        assert client.text(sid) == ""
        assert await harness.runtime.store.item_count(sid) == 0
        assert await _trust(harness, skilled) is None


def _elicit(answer: Any) -> Any:
    return lambda params: answer


async def test_elicitation_accept(harness: Harness, skilled: Path, acp_schema: AcpSchema) -> None:
    async with harness.connect(
        elicitation=_elicit({"action": "accept", "content": {"trustProject": True}})
    ) as client:
        await client.initialize(elicitation_form=True)
        sid = (await client.new_session(str(skilled)))["sessionId"]
        assert (await client.prompt(sid, "/echo go"))["stopReason"] == "end_turn"
        [request] = client.elicitation_requests
        assert request["mode"] == "form"
        assert request["sessionId"] == sid
        schema = request["requestedSchema"]
        assert schema["required"] == ["trustProject"]
        assert schema["properties"]["trustProject"] == {
            "type": "boolean",
            "title": "Trust this project",
            "default": False,
        }
        assert client.permission_requests == []
        assert await _trust(harness, skilled) is True
        client.validate(acp_schema)


async def test_elicitation_decline_keeps_untrusted(harness: Harness, skilled: Path) -> None:
    async with harness.connect(elicitation=_elicit({"action": "decline"})) as client:
        await client.initialize(elicitation_form=True)
        sid = (await client.new_session(str(skilled)))["sessionId"]
        assert (await client.prompt(sid, "/echo go"))["stopReason"] == "end_turn"
        assert await _trust(harness, skilled) is False


async def test_elicitation_cancel_cancels_the_turn(harness: Harness, skilled: Path) -> None:
    async with harness.connect(elicitation=_elicit({"action": "cancel"})) as client:
        await client.initialize(elicitation_form=True)
        sid = (await client.new_session(str(skilled)))["sessionId"]
        assert (await client.prompt(sid, "/echo go"))["stopReason"] == "cancelled"
        assert await harness.runtime.store.item_count(sid) == 0
        assert await _trust(harness, skilled) is None


def _broken(params: Any) -> Any:
    raise ProtocolError(-32603, "the form could not be shown")


@pytest.mark.parametrize(
    "elicitation",
    [_broken, _elicit({"action": "accept", "content": {"trustProject": "yes"}}), _elicit([])],
)
async def test_elicitation_failure_falls_back_to_the_chooser(
    harness: Harness, skilled: Path, elicitation: Any
) -> None:
    async with harness.connect(elicitation=elicitation, permission=_select("trust")) as client:
        await client.initialize(elicitation_form=True)
        sid = (await client.new_session(str(skilled)))["sessionId"]
        assert (await client.prompt(sid, "/echo go"))["stopReason"] == "end_turn"
        assert len(client.elicitation_requests) == 1
        assert len(client.permission_requests) == 1
        assert await _trust(harness, skilled) is True


async def test_no_question_without_real_skills(
    harness: Harness, project: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere-skill"
    elsewhere.write_text("# not here\n")
    skills = project / ".agents" / "skills" / "linked"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").symlink_to(elsewhere)
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "/echo go"))["stopReason"] == "end_turn"
        assert client.permission_requests == []


async def test_loaded_task_is_asked_when_skills_appeared(harness: Harness, project: Path) -> None:
    async with harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "before the skill existed")
        await client.close_session(sid)
    skill = project / ".agents" / "skills" / "late"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("# late\n")
    async with harness.connect(permission=_select("keep_disabled")) as client:
        await client.load_session(sid, str(project))
        await client.prompt(sid, "/echo fine")
        assert len(client.permission_requests) == 1
        await client.prompt(sid, "/echo again")
        assert len(client.permission_requests) == 1
        assert await _trust(harness, project) is False
