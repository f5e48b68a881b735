"""Notices: ``turn.notice(level, text)`` reaches a client that opted in
(``clientCapabilities.session.notices``) as a ``notice`` update with its level, a client that
did not as agent text (as before) or, with ``fallback="thought"``, as a thought; the log
always; every frame validated."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from edge_harness import running_service

from maple_acp.runtime import Turn, TurnResult
from maple_acp.testing.schema import AcpSchema


class _NoticeBackend:
    """Sends one notice of each call form, then an answer."""

    async def run_turn(self, turn: Turn) -> TurnResult:
        await turn.notice("warning", "The provider is slow; retrying in 2 s.")
        await turn.notice("An old-style notice.")
        await turn.notice("A keyword one.", level="error")
        await turn.notice("info", "Waiting for the provider.", fallback="thought")
        await turn.send_text("done")
        return TurnResult()


NOTICES = [
    ("warning", "The provider is slow; retrying in 2 s."),
    ("info", "An old-style notice."),
    ("error", "A keyword one."),
]
#: The notice a client without notices sees as a thought, not in the answer's text.
AS_THOUGHT = ("info", "Waiting for the provider.")


async def test_notices_reach_an_opted_in_client_as_notices_and_others_as_text(
    tmp_path: Path, project: Path, acp_schema: AcpSchema, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp")
    async with (
        running_service(tmp_path, backend=_NoticeBackend()) as harness,
        harness.connect() as opted,
        harness.connect(initialize=True) as plain,
    ):
        await opted.initialize(clientCapabilities={"session": {"notices": {}}})
        sid = (await opted.new_session(str(project)))["sessionId"]
        await opted.prompt(sid, "go")
        shown = [
            (u["severity"], u["title"])
            for u in opted.updates(sid)
            if u["sessionUpdate"] == "notice"
        ]
        assert shown == [*NOTICES, AS_THOUGHT]
        assert opted.text(sid) == "done"
        assert opted.text(sid, "agent_thought_chunk") == ""

        other = (await plain.new_session(str(project)))["sessionId"]
        await plain.prompt(other, "go")
        kinds = {u["sessionUpdate"] for u in plain.updates(other)}
        assert "notice" not in kinds
        text = plain.text(other)
        for _, notice in NOTICES:
            assert notice in text
        assert text.endswith("done")
        assert AS_THOUGHT[1] not in text
        assert plain.text(other, "agent_thought_chunk") == AS_THOUGHT[1]
        opted.validate(acp_schema)
        plain.validate(acp_schema)
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if "notice" in r.getMessage()]
    for level, notice in [*NOTICES, AS_THOUGHT]:
        # Logged for both clients, at the notice's own level.
        assert sum(lvl == level.upper() and notice in m for lvl, m in logged) == 2


async def test_a_notice_level_that_is_not_one_is_refused_to_the_backend(
    tmp_path: Path, project: Path
) -> None:
    class _Bad:
        async def run_turn(self, turn: Turn) -> TurnResult:
            try:
                await turn.notice("loud", "x")
            except ValueError as exc:
                await turn.send_text(f"refused: {exc}")
            return TurnResult()

    async with (
        running_service(tmp_path, backend=_Bad()) as harness,
        harness.connect(initialize=True) as client,
    ):
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "go")
        assert client.text(sid).startswith("refused: a notice level is one of")
