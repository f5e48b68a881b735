"""Leases and tasks: create, attach (each refusal), list, history, provisional hygiene,
revocation, release, account and drain fences."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from maple_acp.model import (
    ItemKind,
    TaskPolicy,
    TaskRecord,
    TaskSurface,
    TimelineItem,
    ToolState,
    ToolStatus,
)
from maple_acp.runtime import (
    DEFAULT_PROVISIONAL_GRACE_S,
    AgentService,
    LeaseRevoked,
    RejectionKind,
    RunState,
    RuntimeRejection,
    SessionLease,
    ToolContext,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, demo_service, run_prompt
from maple_acp.testing.store import open_temp_store


def stored_task(root: Path, **fields: Any) -> TaskRecord:
    values: dict[str, Any] = {
        "id": "stored",
        "account": DEMO_ACCOUNT,
        "root": os.path.realpath(root),
        "created_ms": 1_000,
        "updated_ms": 1_000,
        "surface": TaskSurface.EXTERNAL,
        "model": "demo-echo",
    }
    values.update(fields)
    return TaskRecord(**values)


async def rejection(kind: RejectionKind, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(RuntimeRejection) as caught:
        await call(*args, **kwargs)
    assert caught.value.kind is kind, caught.value
    assert caught.value.message
    assert "\n" not in caught.value.message


async def test_new_task_is_provisional_and_hidden_until_prompted(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        assert lease.task.provisional
        assert lease.task.model == "demo-echo"
        assert (await service.list_tasks()).tasks == ()
        await run_prompt(lease, "hello")
        listed = (await service.list_tasks(cwd=str(project))).tasks
        assert [task.id for task in listed] == [lease.task_id]
        await lease.release(close=True)
    # A prompted task survives close.
    assert await service.store.get_task(lease.task_id) is not None


async def test_cwd_is_canonicalised_and_checked(
    service: AgentService, project: Path, tmp_path: Path
) -> None:
    link = tmp_path / "link"
    link.symlink_to(project)
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(link))
        assert lease.task.root == str(project.resolve())
        await lease.release(close=True)
        for bad in ("relative/dir", str(tmp_path / "missing"), str(tmp_path / "f"), "", "/a\x00b"):
            (tmp_path / "f").write_text("file")
            await rejection(RejectionKind.INVALID_CWD, nursery.start, service.serve_new_task, bad)


async def test_attach_refusals_each_have_their_kind(
    service: AgentService, project: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    store = service.store
    await store.create_task(stored_task(project, id="mine"))
    await store.create_task(stored_task(project, id="theirs", account="someone-else"))
    await store.create_task(stored_task(project, id="auto", policy=TaskPolicy.AUTO))
    await store.create_task(stored_task(project, id="retired", model="retired-model"))
    root = str(project)
    async with trio.open_nursery() as nursery:
        start = nursery.start
        await rejection(RejectionKind.TASK_NOT_FOUND, start, service.serve_task, "nope", root)
        await rejection(RejectionKind.WRONG_ACCOUNT, start, service.serve_task, "theirs", root)
        await rejection(RejectionKind.ROOT_MISMATCH, start, service.serve_task, "mine", str(other))
        await rejection(RejectionKind.WRONG_POLICY, start, service.serve_task, "auto", root)
        await rejection(RejectionKind.MODEL_RETIRED, start, service.serve_task, "retired", root)
        # A refused load leaves the task untouched and attachable by nobody else's leftovers.
        assert service.lease_of("retired") is None
        lease = await start(service.serve_task, "mine", root)
        assert not lease.created_here
        await rejection(RejectionKind.TASK_LEASED, start, service.serve_task, "mine", root)
        run = await lease.start_run("/hang")
        await rejection(RejectionKind.RUN_ACTIVE, start, service.serve_task, "mine", root)
        run.cancel()
        await run.wait()
        await lease.release(close=True)
        # A loaded task is never deleted by close.
        assert await store.get_task("mine") is not None
        again = await start(service.serve_task, "mine", root)
        await again.release(close=True)


async def test_revoked_lease_blocks_attach_until_its_cleanup_ends(
    service: AgentService, project: Path
) -> None:
    await service.store.create_task(stored_task(project))
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_task, "stored", str(project))
        lease.revoke()
        await rejection(RejectionKind.LEASE_REVOKED, lease.start_run, "hi")
        await rejection(
            RejectionKind.TASK_LEASED, nursery.start, service.serve_task, "stored", str(project)
        )
        await lease.release()
        assert lease.released
        second = await nursery.start(service.serve_task, "stored", str(project))
        await second.release()


async def test_close_deletes_only_an_untouched_task_created_here(
    service: AgentService, project: Path
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        # The lease's own model change refreshes the snapshot; the row still counts as untouched.
        await lease.set_model("demo-echo-large")
        await lease.release(close=True)
        assert await service.store.get_task(lease.task_id) is None

        touched = await nursery.start(service.serve_new_task, str(project))
        # Someone else renames the row: it is no longer provably untouched.
        await service.store.rename_task(touched.task_id, "kept", user_renamed=True, now_ms=5)
        await touched.release(close=True)
        assert await service.store.get_task(touched.task_id) is not None


async def test_disconnect_keeps_a_provisional_task_for_the_grace_period(
    service: AgentService, project: Path, virtual_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        await lease.release()
        task_id = lease.task_id
        kept = await service.store.get_task(task_id)
        assert kept is not None
        assert kept.provisional_expires_ms is not None
        assert (await service.list_tasks()).tasks == ()
        # Loadable by id within the grace (a client that creates and prompts separately).
        again = await nursery.start(service.serve_task, task_id, str(project))
        reloaded = await service.store.get_task(task_id)
        assert reloaded is not None
        assert reloaded.provisional_expires_ms is None
        await again.release()
        # Released again without a close: its grace starts again.
        assert await service.store.get_task(task_id) is not None
        await trio.sleep(DEFAULT_PROVISIONAL_GRACE_S / 2)
        assert await service.sweep_provisional() == []
        # The periodic sweep removes it once the grace has expired.
        await trio.sleep(DEFAULT_PROVISIONAL_GRACE_S)
        assert await service.store.get_task(task_id) is None


async def test_a_close_by_a_lease_that_loaded_an_untouched_task_deletes_it(
    service: AgentService, project: Path
) -> None:
    # As a close by its creator does: clients create in one process and use it from another.
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        await lease.release()
        again = await nursery.start(service.serve_task, lease.task_id, str(project))
        await again.release(close=True)
        assert await service.store.get_task(lease.task_id) is None


async def test_zero_grace_deletes_on_disconnect(tmp_path: Path, project: Path) -> None:
    async with (
        demo_service(tmp_path, provisional_grace_s=0) as service,
        trio.open_nursery() as nursery,
    ):
        lease = await nursery.start(service.serve_new_task, str(project))
        await lease.release()
        assert await service.store.get_task(lease.task_id) is None
        prompted = await nursery.start(service.serve_new_task, str(project))
        await run_prompt(prompted, "keep me")
        await prompted.release()
        assert await service.store.get_task(prompted.task_id) is not None


async def test_startup_sweep_removes_stranded_provisional_tasks(
    tmp_path: Path, project: Path
) -> None:
    store = await open_temp_store(tmp_path)
    await store.create_task(stored_task(project, id="stranded", provisional=True))
    await store.create_task(stored_task(project, id="renamed", provisional=True, user_renamed=True))
    await store.create_task(stored_task(project, id="talked", provisional=True))
    await store.admit_user_message(
        "talked",
        TimelineItem(item_id="u", kind=ItemKind.USER, created_ms=2_000, text="hi"),
        now_ms=2_000,
    )
    await store.aclose()
    async with demo_service(tmp_path) as service:
        assert service.status().ready
        assert await service.store.get_task("stranded") is None
        assert await service.store.get_task("renamed") is not None
        assert await service.store.get_task("talked") is not None


async def test_list_pages_and_cursor(service: AgentService, project: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    for index in range(105):
        await service.store.create_task(
            stored_task(project, id=f"t{index:03}", updated_ms=10_000 + index)
        )
    await service.store.create_task(stored_task(other, id="elsewhere", updated_ms=1))
    first = await service.list_tasks(cwd=str(project))
    assert len(first.tasks) == 100
    assert first.tasks[0].id == "t104"
    assert first.next_cursor is not None
    second = await service.list_tasks(cwd=str(project), cursor=first.next_cursor)
    assert [task.id for task in second.tasks] == [f"t{i:03}" for i in range(4, -1, -1)]
    assert second.next_cursor is None
    everything = await service.list_tasks(limit=1000)
    assert len(everything.tasks) == 100
    await rejection(RejectionKind.INVALID_CURSOR, service.list_tasks, cursor="forged")


async def test_pages_do_not_overlap(service: AgentService, project: Path) -> None:
    for index in range(101):
        await service.store.create_task(stored_task(project, id=f"t{index:03}", updated_ms=index))
    first = await service.list_tasks()
    second = await service.list_tasks(cursor=first.next_cursor)
    assert [task.id for task in second.tasks] == ["t000"]


async def test_history_replays_terminal_tool_output(service: AgentService, project: Path) -> None:
    await service.store.create_task(stored_task(project))
    tool = ToolState(
        name="shell", status=ToolStatus.PENDING, title="run ls", raw_input={"command": "ls"}
    )
    await service.store.upsert_items(
        "stored",
        [TimelineItem(item_id="tool", kind=ItemKind.TOOL, created_ms=1, text="run ls", tool=tool)],
        now_ms=2,
    )
    done = ToolState(name="shell", status=ToolStatus.COMPLETED, output_text="a\nb")
    await service.store.upsert_items(
        "stored",
        [TimelineItem(item_id="tool", kind=ItemKind.TOOL, created_ms=1, text="run ls", tool=done)],
        now_ms=3,
    )
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_task, "stored", str(project))
        [item] = await lease.history()
        assert item.text == "a\nb"
        assert item.tool is not None
        assert item.tool.raw_input == {"command": "ls"}
        await lease.release()


async def test_sign_out_revokes_and_fences(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/hang")
        session = lease.session_events()
        service.sign_out()
        assert lease.revoked
        assert (await run.wait()).state is RunState.CANCELLED
        assert isinstance(await session.__anext__(), LeaseRevoked)
        await rejection(RejectionKind.LEASE_REVOKED, lease.start_run, "x")
        await rejection(RejectionKind.NOT_SIGNED_IN, service.list_tasks)
        service.sign_in("another")
        # The old lease stays revoked under the new account.
        await rejection(RejectionKind.LEASE_REVOKED, lease.history)
        await lease.release()
        await rejection(
            RejectionKind.WRONG_ACCOUNT,
            nursery.start,
            service.serve_task,
            lease.task_id,
            str(project),
        )


async def test_operation_captured_before_an_account_change_is_rejected(
    service: AgentService, project: Path
) -> None:
    gate = trio.Event()

    class SlowCatalog:
        def default_model(self, account: str) -> Any:
            return service_catalog.default_model(account)

        async def list_models(self, account: str) -> Any:
            await gate.wait()
            return await service_catalog.list_models(account)

    from maple_acp.backends.demo import demo_catalog

    service_catalog = demo_catalog()
    service._models._catalog = SlowCatalog()  # the host swaps catalogs only in this test
    async with trio.open_nursery() as nursery:
        outcome: list[BaseException] = []

        async def listing() -> None:
            try:
                await service.model_choices(refresh=True)
            except RuntimeRejection as exc:
                outcome.append(exc)

        nursery.start_soon(listing)
        await trio.testing.wait_all_tasks_blocked()
        service.sign_in("someone-else")
        gate.set()
    assert isinstance(outcome[0], RuntimeRejection)
    assert outcome[0].kind is RejectionKind.ACCOUNT_CHANGED


async def test_drain_cancels_runs_and_stops_admission(service: AgentService, project: Path) -> None:
    async with trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, str(project))
        run = await lease.start_run("/hang")
        assert service.status().active_runs == 1
        assert await service.drain()
        assert (await run.wait()).state is RunState.CANCELLED
        status = service.status()
        assert status.draining
        assert status.active_runs == 0
        await rejection(RejectionKind.SHUTTING_DOWN, lease.start_run, "x")
        await rejection(
            RejectionKind.SHUTTING_DOWN, nursery.start, service.serve_new_task, str(project)
        )
        await lease.release()
        assert service.status().leases == 0


class RecordingRouter:
    def __init__(self) -> None:
        self.revoked = False
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def tool_definition(self) -> Any:
        return None

    async def call(self, tool_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((tool_id, arguments))
        return {"content": [{"type": "text", "text": "pong"}]}

    def revoke(self) -> None:
        self.revoked = True


async def test_router_is_made_in_the_lease_nursery_before_the_lease_exists(
    service: AgentService, project: Path
) -> None:
    await service.store.create_task(stored_task(project))
    router = RecordingRouter()
    seen: list[trio.Nursery] = []

    async def factory(nursery: trio.Nursery, task_id: str) -> RecordingRouter:
        seen.append(nursery)
        # Nobody else can take the task while the router connects.
        assert service.lease_of("stored") is not None
        return router

    async with trio.open_nursery() as nursery:
        lease: SessionLease = await nursery.start(
            lambda task_status: service.serve_task(
                "stored", str(project), router_factory=factory, task_status=task_status
            )
        )
        assert seen
        assert lease.tools.router is router
        lease.revoke()
        assert router.revoked
        assert lease.tools.router is None
        await lease.release()


async def test_a_failing_router_factory_releases_the_task(
    service: AgentService, project: Path
) -> None:
    await service.store.create_task(stored_task(project))

    async def factory(nursery: trio.Nursery, task_id: str) -> RecordingRouter:
        raise OSError("connection refused")

    async with trio.open_nursery() as nursery:
        with pytest.raises(OSError, match="connection refused"):
            await nursery.start(
                lambda task_status: service.serve_task(
                    "stored", str(project), router_factory=factory, task_status=task_status
                )
            )
        assert service.lease_of("stored") is None
        with pytest.raises(OSError, match="connection refused"):
            await nursery.start(
                lambda task_status: service.serve_new_task(
                    str(project), router_factory=factory, task_status=task_status
                )
            )
    assert (await service.store.list_tasks(_all_query())).tasks == (
        await service.store.get_task("stored"),
    )


def _all_query() -> Any:
    from maple_acp.model import TaskQuery

    return TaskQuery(account=DEMO_ACCOUNT, include_provisional=True)


async def test_relay_values_are_checked(service: AgentService, project: Path) -> None:
    bad_forms: list[dict[str, str]] = [
        {"NOT_ALLOWED": "x"},
        {"MAPLE_TOKEN": "a\x00b"},
        {"MAPLE_TOKEN": "x" * (16 * 1024 + 1)},
        {"BAD NAME": "x"},
        {"MAPLE_TOKEN": "x" * 16 * 1024, "PATH": "y" * 16 * 1024 + "z"},
    ]
    async with trio.open_nursery() as nursery:
        for relay in bad_forms:
            with pytest.raises(RuntimeRejection) as caught:
                await nursery.start(
                    lambda task_status, relay=relay: service.serve_new_task(
                        str(project), relay=relay, task_status=task_status
                    )
                )
            assert caught.value.kind is RejectionKind.INVALID_RELAY
            assert "x" * 20 not in caught.value.message
        lease = await nursery.start(
            lambda task_status: service.serve_new_task(
                str(project), relay={"MAPLE_TOKEN": "secret"}, task_status=task_status
            )
        )
        assert lease.tools.relay_names == {"MAPLE_TOKEN"}
        assert lease.tools.child_environment()["MAPLE_TOKEN"] == "secret"
        lease.revoke()
        assert "MAPLE_TOKEN" not in lease.tools.child_environment() or os.environ.get("MAPLE_TOKEN")
        await lease.release(close=True)
    assert isinstance(ToolContext(), ToolContext)
