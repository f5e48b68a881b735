"""Models (catalog bound, filtering, fallback, lock), project trust, and goals."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from maple_acp.model import GoalStatus
from maple_acp.runtime import (
    MODEL_DISCOVERY_BOUND_S,
    AgentService,
    CycleStarted,
    GoalChanged,
    ModelInfo,
    RejectionKind,
    RunNotice,
    RunState,
    RuntimeRejection,
    SessionEvents,
    TextChunk,
    find_project_skills,
)
from maple_acp.runtime import _trust as trust_module
from maple_acp.runtime._models import ModelCatalogCache
from maple_acp.testing.demo import collect_events, demo_service, run_prompt

DEFAULT = ModelInfo(id="default", name="Default")


class ScriptedCatalog:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls = 0

    def default_model(self, account: str) -> ModelInfo:
        return DEFAULT

    async def list_models(self, account: str) -> Sequence[ModelInfo]:
        self.calls += 1
        answer = self.answers.pop(0)
        if answer == "hang":
            await trio.sleep_forever()
        if isinstance(answer, Exception):
            raise answer
        await trio.lowlevel.checkpoint()
        return answer  # type: ignore[no-any-return]


async def choices(cache: ModelCatalogCache, *, refresh: bool = True) -> Any:
    return await cache.choices("acct", 1, lambda: 1, refresh=refresh)


async def test_catalog_filters_non_chat_and_puts_the_default_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listed = [
        ModelInfo(id="b", name="B"),
        ModelInfo(id="embed", name="E", chat=False),
        DEFAULT,
        ModelInfo(id="b", name="B again"),
    ]
    cache = ModelCatalogCache(ScriptedCatalog([listed]))
    result = await choices(cache)
    assert result.ids == ("default", "b")
    assert result.refreshed


async def test_catalog_listing_is_bounded_and_falls_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    catalog = ScriptedCatalog([[ModelInfo(id="b", name="B")], "hang", RuntimeError("down")])
    cache = ModelCatalogCache(catalog)
    assert (await choices(cache)).ids == ("default", "b")
    start = trio.current_time()
    stale = await choices(cache)
    assert trio.current_time() - start == pytest.approx(MODEL_DISCOVERY_BOUND_S)
    assert not stale.refreshed
    assert stale.ids == ("default", "b")
    failed = await choices(cache)
    assert not failed.refreshed
    assert "default" in failed
    # Nothing cached at all: the default alone is still offered.
    empty = ModelCatalogCache(ScriptedCatalog([RuntimeError("down")]))
    assert (await choices(empty)).ids == ("default",)


async def test_catalog_listing_is_cancellable(autojump_clock: trio.testing.MockClock) -> None:
    cache = ModelCatalogCache(ScriptedCatalog(["hang"]))
    with trio.move_on_after(1) as scope:
        await choices(cache)
    assert scope.cancelled_caught


async def test_warm_cache_is_reused(autojump_clock: trio.testing.MockClock) -> None:
    catalog = ScriptedCatalog([[DEFAULT], [DEFAULT]])
    cache = ModelCatalogCache(catalog)
    await choices(cache)
    await choices(cache, refresh=False)
    assert catalog.calls == 1
    assert cache.cached("acct", 1) is not None
    assert cache.cached("acct", 2) is None


async def test_model_is_locked_after_the_first_message(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        with pytest.raises(RuntimeRejection) as caught:
            await lease.set_model("demo-embed")
        assert caught.value.kind is RejectionKind.UNKNOWN_MODEL
        await lease.set_model("demo-echo-large")
        await run_prompt(lease, "hi")
        with pytest.raises(RuntimeRejection) as caught:
            await lease.set_model("demo-echo")
        assert caught.value.kind is RejectionKind.MODEL_LOCKED
        assert (await lease.set_model("demo-echo-large")).model == "demo-echo-large"
        stored = await service.store.get_task(lease.task_id)
        assert stored is not None
        assert stored.model == "demo-echo-large"
        await lease.release(close=True)


async def test_a_model_the_host_stopped_offering_is_told_at_the_next_prompt(
    tmp_path: Path, project: Path
) -> None:
    other = ModelInfo(id="other", name="Other")
    catalog = ScriptedCatalog([[DEFAULT, other], [DEFAULT]])
    data = tmp_path / "data"
    data.mkdir()
    async with demo_service(data, catalog=catalog) as service, trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        await lease.model_choices(refresh=True)
        await lease.set_model("other")
        first, _ = await run_prompt(lease, "hi")
        assert not [e for e in first if isinstance(e, RunNotice)]
        # The next listing no longer has it: the locked session keeps it, and says so.
        await lease.model_choices(refresh=True)
        events, _outcome = await run_prompt(lease, "again")
        notices = [e for e in events if isinstance(e, RunNotice)]
        assert [(n.level, n.text) for n in notices][:1] == [
            (
                "warning",
                "the session's model other is no longer offered by the host; "
                "this session keeps it, but it may not answer",
            )
        ]
        assert events.index(notices[0]) < min(
            i for i, e in enumerate(events) if not isinstance(e, RunNotice)
        )
        assert lease.task.model == "other"
        await lease.release(close=True)


def make_skill(root: Path, relative: str) -> Path:
    path = root / ".agents" / "skills" / relative / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# skill\n")
    return path


def test_skill_detection_follows_no_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    make_skill(real, "a")
    assert [s.name for s in find_project_skills(str(real))] == ["a"]

    nested = tmp_path / "nested"
    make_skill(nested, "a/b")
    assert [s.name for s in find_project_skills(str(nested))] == [os.path.join("a", "b")]

    linked_file = tmp_path / "linked_file"
    (linked_file / ".agents" / "skills" / "a").mkdir(parents=True)
    (linked_file / ".agents" / "skills" / "a" / "SKILL.md").symlink_to(make_skill(real, "target"))
    assert find_project_skills(str(linked_file)) == ()

    linked_dir = tmp_path / "linked_dir"
    (linked_dir / ".agents").mkdir(parents=True)
    (linked_dir / ".agents" / "skills").symlink_to(real / ".agents" / "skills")
    assert find_project_skills(str(linked_dir)) == ()

    linked_sub = tmp_path / "linked_sub"
    (linked_sub / ".agents" / "skills").mkdir(parents=True)
    (linked_sub / ".agents" / "skills" / "a").symlink_to(real / ".agents" / "skills" / "a")
    assert find_project_skills(str(linked_sub)) == ()

    assert find_project_skills(str(tmp_path / "missing")) == ()


async def test_trust_decision_is_needed_once_and_persisted(
    service: AgentService, project: Path
) -> None:
    make_skill(project, "helper")
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        status = await lease.trust_status()
        assert status.decision_needed
        assert lease.skills == ()
        await lease.decide_trust(True)
        assert [skill.name for skill in lease.skills] == ["helper"]
        assert not (await lease.trust_status()).decision_needed
        await lease.release(close=True)
        assert await service.project_trust(str(project)) is True
        # Another lease on the same project inherits the decision, and its skills.
        second = await nursery.start(service.serve_new_task, str(project))
        assert not (await second.trust_status()).decision_needed
        with pytest.raises(RuntimeRejection) as caught:
            await service.set_project_trust(str(project), False)
        assert caught.value.kind is RejectionKind.TRUST_BUSY
        await second.decide_trust(False)
        assert second.skills == ()
        await second.release(close=True)
        await service.set_project_trust(str(project), None)
        assert await service.project_trust(str(project)) is None


async def test_a_project_is_scanned_once_per_first_prompt_and_never_at_open(
    service: AgentService, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_skill(project, "helper")
    scans: list[str] = []
    real_scan = trust_module.find_project_skills

    def counting_scan(root: str) -> Any:
        scans.append(root)
        return real_scan(root)

    monkeypatch.setattr(trust_module, "find_project_skills", counting_scan)
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        assert scans == []
        # The trust question and its answer share one scan; the turn reuses the result.
        assert (await lease.trust_status()).decision_needed
        await lease.decide_trust(True)
        await run_prompt(lease, "hello")
        assert len(scans) == 1
        assert [skill.name for skill in lease.skills] == ["helper"]
        await lease.release(close=True)
        # Loading the (now trusted) task scans nothing until its first turn needs the skills.
        loaded = await nursery.start(service.serve_task, lease.task_id, str(project))
        assert len(scans) == 1
        await run_prompt(loaded, "again")
        assert len(scans) == 2
        await loaded.release(close=True)


async def test_no_skills_means_no_decision(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        assert not (await lease.trust_status()).decision_needed
        await lease.release(close=True)


async def next_goal(session: SessionEvents) -> Any:
    async for event in session:
        if isinstance(event, GoalChanged):
            return event.goal
    raise AssertionError("session ended")


async def drain_cycles(session: SessionEvents, until: GoalStatus) -> list[Any]:
    """Read session events, consuming each goal cycle's run, until the goal reaches
    ``until``; return the snapshots seen."""
    snapshots = []
    async for event in session:
        if isinstance(event, CycleStarted):
            await collect_events(event.run)
        elif isinstance(event, GoalChanged):
            snapshots.append(event.goal)
            if event.goal is not None and event.goal.status is until:
                return snapshots
    raise AssertionError("session ended")


@pytest.mark.parametrize(
    ("objective", "status", "iterations"),
    [
        ("ship it, complete after 2", GoalStatus.COMPLETE, 2),
        ("this will block", GoalStatus.BLOCKED, 1),
        ("hit the limit", GoalStatus.LIMITED, 1),
        ("no script", GoalStatus.COMPLETE, 3),
    ],
)
async def test_goal_cycles_run_until_the_script_ends_them(
    service: AgentService, project: Path, objective: str, status: GoalStatus, iterations: int
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        session = lease.session_events()
        goal = await lease.set_goal(f"  {objective}  ")
        assert goal.objective == objective
        assert goal.status is GoalStatus.ACTIVE
        snapshots = await drain_cycles(session, status)
        final = snapshots[-1]
        assert final.iterations == iterations
        assert final.last_reason
        assert final.updated_ms >= final.created_ms
        assert lease.active_run is None
        stored = await service.store.get_goal(lease.task_id)
        assert stored == final
        await lease.release(close=True)


async def test_goal_actions_and_their_refusals(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        session = lease.session_events()
        for blank in ("", "   ", "\n\t"):
            with pytest.raises(RuntimeRejection) as caught:
                await lease.set_goal(blank)
            assert caught.value.kind is RejectionKind.INVALID_GOAL
        with pytest.raises(RuntimeRejection) as caught:
            await lease.pause_goal()
        assert caught.value.kind is RejectionKind.GOAL_STATE
        await lease.set_goal("hang forever", token_budget=100)
        async for event in session:
            if isinstance(event, CycleStarted):
                cycle = event.run
                break
        paused = await lease.pause_goal()
        assert paused.status is GoalStatus.PAUSED
        assert paused.token_budget == 100
        # Pausing stops the running cycle at its boundary, and starts no other.
        assert (await cycle.wait()).state is RunState.CANCELLED
        with pytest.raises(RuntimeRejection):
            await lease.pause_goal()
        await trio.testing.wait_all_tasks_blocked()
        assert lease.active_run is None
        assert (await lease.resume_goal()).status is GoalStatus.ACTIVE
        await lease.clear_goal()
        assert lease.goal is None
        assert await service.store.get_goal(lease.task_id) is None
        seen = []
        while True:
            event = await session.__anext__()
            if isinstance(event, CycleStarted):
                await collect_events(event.run)
                continue
            seen.append(event)
            if isinstance(event, GoalChanged) and event.goal is None:
                break
        await lease.release(close=True)


async def test_a_prompt_preempts_a_goal_cycle(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        session = lease.session_events()
        await lease.set_goal("hang in every cycle")
        async for event in session:
            if isinstance(event, CycleStarted):
                cycle = event.run
                break
        cycle_events = [e async for e in _first_text(cycle)]
        assert cycle_events
        await lease.pause_goal()  # so no new cycle starts after the prompt
        await lease.resume_goal()
        run = await lease.start_run("/echo mine")
        assert cycle.ended
        assert (await cycle.wait()).state is RunState.CANCELLED
        events = await collect_events(run)
        assert any(isinstance(e, TextChunk) and e.text == "mine" for e in events)
        goal = lease.goal
        assert goal is not None
        assert goal.iterations == 0  # a preempted cycle does not count
        await lease.clear_goal()
        await lease.release(close=True)


async def _first_text(run: Any) -> Any:
    async for event in run.events():
        yield event
        if isinstance(event, TextChunk):
            return


async def test_goal_set_from_a_prompt(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        session = lease.session_events()
        _, outcome = await run_prompt(lease, "/goal finish the job, complete after 1")
        assert outcome.state is RunState.COMPLETED
        first = await next_goal(session)
        assert first.objective == "finish the job, complete after 1"
        snapshots = await drain_cycles(session, GoalStatus.COMPLETE)
        assert snapshots[-1].iterations == 1
        await lease.release(close=True)
