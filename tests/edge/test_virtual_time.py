"""Virtual time stands still while the runtime works: under ``MockClock(autojump_threshold=0)``
and the kit's store recipe, a session's creation and its first prompt (a directory
canonicalised, a project scanned for skills, each in a worker thread) take no virtual time, so
a host's test that checks a deadline never sees one pass on its own."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from maple_acp.testing.service import running_demo_acp


async def test_a_new_session_and_its_first_prompt_take_no_virtual_time(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / ".agents" / "skills" / "demo").mkdir(parents=True)
    (project / ".agents" / "skills" / "demo" / "SKILL.md").write_text("a skill\n")
    # A host's own deadline, pending the whole time: the first thing a leap would reach.
    with trio.fail_after(3600):
        async with running_demo_acp(tmp_path) as harness:
            assert trio.current_time() == 0.0  # opening the store took none either
            async with harness.connect(initialize=True) as client:
                before = trio.current_time()
                sid = (await client.new_session(str(project)))["sessionId"]
                assert trio.current_time() == before
                answer = await client.prompt(sid, "/echo hi")
                assert answer["stopReason"] == "end_turn"
                assert trio.current_time() == before
                # A second session in another directory and a load: the same paths again.
                other = tmp_path / "other"
                other.mkdir()
                second = (await client.new_session(str(other)))["sessionId"]
                await client.prompt(second, "/echo again")
                await client.close_session(second)
                await client.load_session(second, str(other))
                assert trio.current_time() == before
