"""A re-attach (a second ``session/load`` or ``/resume`` of a session the connection holds)
answers under the runtime's one attach rule: the cwd is admitted under both sets of allowed
roots and must name the task's root."""

from __future__ import annotations

from pathlib import Path

import pytest
from edge_harness import running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.wire import ProtocolError


async def test_a_reattach_outside_the_allowed_roots_is_refused_by_the_roots_rule(
    tmp_path: Path, project: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    inside = project / "sub"
    inside.mkdir()
    config = AcpServiceConfig(allowed_roots=(str(project),))
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        sid = (await client.new_session(str(project)))["sessionId"]
        with pytest.raises(ProtocolError) as refused:
            await client.load_session(sid, str(outside))
        assert refused.value.code == -32602
        assert "outside the allowed roots" in refused.value.message
        # Inside the roots but another directory: the task's root is the rule.
        with pytest.raises(ProtocolError) as elsewhere:
            await client.resume_session(sid, str(inside))
        assert elsewhere.value.code == -32602
        assert "not the session's project root" in elsewhere.value.message
        # The session is kept, and the right cwd re-attaches.
        await client.load_session(sid, str(project))
        assert (await client.prompt(sid, "/echo still here"))["stopReason"] == "end_turn"
