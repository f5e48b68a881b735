"""The rules the runtime owns alone (the edge only translates their rejections): the project
directory (canonical, allowed roots), relay values, one prompt at a time, and the operation
barrier."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
from maple_acp.runtime import (
    MAX_ADDITIONAL_DIRECTORIES,
    AgentService,
    RejectionKind,
    RelayValues,
    RuntimeRejection,
    SessionLease,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, collect_events
from maple_acp.testing.store import temp_store


async def refused(kind: RejectionKind, call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(RuntimeRejection) as caught:
        await call(*args, **kwargs)
    assert caught.value.kind is kind, caught.value
    return caught.value.message


async def open_lease(nursery: trio.Nursery, service: AgentService, cwd: str) -> SessionLease:
    lease: SessionLease = await nursery.start(
        lambda task_status: service.serve_new_task(cwd, task_status=task_status)
    )
    return lease


@pytest.fixture
async def rooted(tmp_path: Path) -> AsyncIterator[tuple[AgentService, Path]]:
    """A service whose allowed roots are ``tmp_path/allowed`` (given through a symlink, so the
    policy itself is canonicalised)."""
    allowed = tmp_path / "allowed"
    (allowed / "project").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(allowed, tmp_path / "link")
    data = tmp_path / "data"
    data.mkdir()
    async with temp_store(data) as store:
        service = AgentService(
            store=store,
            backend=DemoBackend(),
            catalog=demo_catalog(),
            policy=demo_policy(),
            allowed_roots=(str(tmp_path / "link"),),
            relay_allow_list=("MAPLE_TOKEN",),
        )
        async with service:
            service.sign_in(DEMO_ACCOUNT)
            yield service, tmp_path


# -- the project directory -----------------------------------------------------------------


async def test_cwd_is_canonicalised_once_and_checked_against_the_roots(
    rooted: tuple[AgentService, Path],
) -> None:
    service, base = rooted
    project = base / "allowed" / "project"
    os.symlink(project, base / "project-link")
    async with trio.open_nursery() as nursery:
        lease = await open_lease(nursery, service, str(base / "project-link"))
        # The task's root is the canonical directory, not the symlink the caller gave.
        assert lease.task.root == os.path.realpath(project)
        await lease.release(close=True)
        for bad in ("relative/dir", "", "/no/such/directory", str(base / "elsewhere")):
            message = await refused(
                RejectionKind.INVALID_CWD,
                nursery.start,
                lambda task_status, cwd=bad: service.serve_new_task(cwd, task_status=task_status),
            )
            assert "\n" not in message
        # A symlink that points outside the roots is judged by where it points.
        os.symlink(base / "elsewhere", base / "allowed" / "escape")
        await refused(
            RejectionKind.INVALID_CWD,
            nursery.start,
            lambda task_status: service.serve_new_task(
                str(base / "allowed" / "escape"), task_status=task_status
            ),
        )
    # Loading and listing apply the same rule.
    await refused(RejectionKind.INVALID_CWD, service.list_tasks, cwd=str(base / "elsewhere"))
    await refused(RejectionKind.INVALID_CWD, service.list_tasks, cwd="relative")
    async with trio.open_nursery() as nursery:
        await refused(
            RejectionKind.INVALID_CWD,
            nursery.start,
            lambda task_status: service.serve_task(
                "any", str(base / "elsewhere"), task_status=task_status
            ),
        )


async def test_a_callers_own_roots_apply_with_the_services(
    rooted: tuple[AgentService, Path],
) -> None:
    service, base = rooted
    allowed = base / "allowed"
    (allowed / "other").mkdir()
    mine = (os.path.realpath(allowed / "project"),)
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(allowed / "project"), allowed_roots=mine, task_status=task_status
            )
        )
        await lease.start_run("listed")
        await lease.drain()
        await lease.release(close=True)
        # Inside the service's roots but outside the caller's: refused the same way.
        await refused(
            RejectionKind.INVALID_CWD,
            nursery.start,
            lambda task_status: service.serve_new_task(
                str(allowed / "other"), allowed_roots=mine, task_status=task_status
            ),
        )
        await refused(
            RejectionKind.INVALID_CWD,
            nursery.start,
            lambda task_status: service.serve_task(
                lease.task_id, str(allowed / "other"), allowed_roots=mine, task_status=task_status
            ),
        )
    await refused(
        RejectionKind.INVALID_CWD,
        service.list_tasks,
        cwd=str(allowed / "other"),
        allowed_roots=mine,
    )
    assert [t.id for t in (await service.list_tasks(allowed_roots=mine)).tasks] == [lease.task_id]
    elsewhere = (os.path.realpath(allowed / "other"),)
    assert (await service.list_tasks(allowed_roots=elsewhere)).tasks == ()


def test_a_grace_period_must_be_finite(tmp_path: Path) -> None:
    for grace in (float("inf"), float("nan"), 1e306, -1.0):
        with pytest.raises(ValueError, match="grace"):
            AgentService(
                store=None,  # type: ignore[arg-type]
                backend=DemoBackend(),
                catalog=demo_catalog(),
                policy=demo_policy(),
                provisional_grace_s=grace,
            )


# -- relay values --------------------------------------------------------------------------


async def test_accept_relay_keeps_allowed_names_and_checks_them_once(
    rooted: tuple[AgentService, Path],
) -> None:
    service, base = rooted
    relay = service.accept_relay({"MAPLE_TOKEN": "s3cr3t-value", "OTHER": "dropped-value"})
    assert isinstance(relay, RelayValues)
    assert dict(relay) == {"MAPLE_TOKEN": "s3cr3t-value"}
    assert relay.dropped == 1
    assert "s3cr3t" not in repr(relay)
    for bad in ({"MAPLE_TOKEN": "a\x00b"}, {"MAPLE_TOKEN": "x" * (16 * 1024 + 1)}):
        with pytest.raises(RuntimeRejection) as caught:
            service.accept_relay(bad)
        assert caught.value.kind is RejectionKind.INVALID_RELAY
        assert "xxxx" not in caught.value.message
    with pytest.raises(RuntimeRejection) as caught:
        service.accept_relay(["MAPLE_TOKEN"])  # type: ignore[arg-type]
    assert caught.value.kind is RejectionKind.INVALID_RELAY
    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(base / "allowed" / "project"), relay=relay, task_status=task_status
            )
        )
        assert lease.tools.child_environment()["MAPLE_TOKEN"] == "s3cr3t-value"
        await lease.release(close=True)


# -- one prompt at a time ------------------------------------------------------------------


async def test_one_prompt_at_a_time_includes_the_time_before_the_run(
    rooted: tuple[AgentService, Path],
) -> None:
    service, base = rooted
    async with trio.open_nursery() as nursery:
        lease = await open_lease(nursery, service, str(base / "allowed" / "project"))
        with lease.claim_prompt() as claim:
            # Held while the caller still settles trust: a second prompt is refused already.
            with pytest.raises(RuntimeRejection) as caught, lease.claim_prompt():
                pass
            assert caught.value.kind is RejectionKind.RUN_ACTIVE
            await refused(RejectionKind.RUN_ACTIVE, lease.start_run, "sneaking in")
            run = await lease.start_run("first", claim=claim)
            events = await collect_events(run)
            assert (await run.wait()).state.value == "completed"
            assert events
            # The run ended but the caller still holds the prompt (it answers the client).
            await refused(RejectionKind.RUN_ACTIVE, lease.start_run, "still too early")
        run = await lease.start_run("second")
        await collect_events(run)
        # A claim from an earlier prompt cannot start another run.
        await refused(RejectionKind.RUN_ACTIVE, lease.start_run, "stale", claim=claim)
        # A prompt's active run holds the slot too.
        hanging = await lease.start_run("/hang")
        with pytest.raises(RuntimeRejection) as caught, lease.claim_prompt():
            pass
        assert caught.value.kind is RejectionKind.RUN_ACTIVE
        hanging.cancel()
        await collect_events(hanging)
        await lease.release(close=True)


# -- the operation barrier -----------------------------------------------------------------


async def test_release_waits_for_operations_in_flight(
    rooted: tuple[AgentService, Path],
) -> None:
    service, base = rooted
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        lease = await open_lease(nursery, service, str(base / "allowed" / "project"))
        finish = trio.Event()

        async def caller_work() -> None:
            with lease.operation():
                await finish.wait()
                order.append("operation ended")

        async def drain_then_note() -> None:
            await lease.drain()
            order.append("drained")

        nursery.start_soon(caller_work)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(drain_then_note)
        await trio.testing.wait_all_tasks_blocked()
        assert order == []
        finish.set()
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["operation ended", "drained"]
        # A revoked lease admits no new operation.
        lease.revoke()
        with pytest.raises(RuntimeRejection) as caught, lease.operation():
            pass
        assert caught.value.kind is RejectionKind.LEASE_REVOKED
        await lease.release(close=True)


async def test_additional_directories_are_admitted_like_the_cwd_and_stored(
    rooted: tuple[AgentService, Path],
) -> None:
    service, base = rooted
    allowed = base / "allowed"
    extras = [allowed / f"extra{n}" for n in range(MAX_ADDITIONAL_DIRECTORIES + 1)]
    for extra in extras:
        extra.mkdir()
    project = str(allowed / "project")

    def new(directories: list[str]) -> Any:
        return lambda task_status: service.serve_new_task(
            project, additional_directories=directories, task_status=task_status
        )

    async with trio.open_nursery() as nursery:
        for directories in (
            [str(e) for e in extras],  # one too many
            ["relative/dir"],
            [str(base / "elsewhere")],  # outside the allowed roots
            [str(allowed / "missing")],
        ):
            await refused(RejectionKind.INVALID_CWD, nursery.start, new(directories))
        wanted = [str(e) for e in extras[:MAX_ADDITIONAL_DIRECTORIES]]
        lease: SessionLease = await nursery.start(new(wanted))
        stored = tuple(os.path.realpath(d) for d in wanted)
        assert lease.task.additional_directories == stored
        task_id = lease.task_id
        await lease.start_run("keep me")
        await lease.drain()
        await lease.release(close=True)

        def attach(directories: list[str]) -> Any:
            return lambda task_status: service.serve_task(
                task_id, project, additional_directories=directories, task_status=task_status
            )

        for directories in ([], wanted[:-1], [*wanted[:-1], str(allowed / "project")]):
            await refused(RejectionKind.ROOT_MISMATCH, nursery.start, attach(directories))
        # The same set in another order attaches, and the runs see every directory.
        again: SessionLease = await nursery.start(attach(list(reversed(wanted))))
        assert again.task.additional_directories == stored
        await refused(
            RejectionKind.ROOT_MISMATCH,
            service.check_root,
            again,
            project,
            additional_directories=wanted[:1],
        )
        await service.check_root(again, project, additional_directories=wanted)
        await again.release(close=True)
