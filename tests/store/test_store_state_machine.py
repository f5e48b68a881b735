"""A Hypothesis state machine: the SQLite store against a plain in-memory model."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from maple_acp.model import ItemKind, TaskPolicy, TaskQuery, TaskRecord, TaskSurface, TimelineItem
from maple_acp.store import StoreError
from maple_acp.testing.store import open_temp_store

T = TypeVar("T")

#: Few ids, so rules keep meeting the same tasks (and creating over an existing one).
TASK_ID_VALUES = ("a", "b", "c", "d", "e")
TASK_IDS = st.sampled_from(TASK_ID_VALUES)
ITEM_IDS = st.sampled_from(["i1", "i2", "i3", "i4"])
ACCOUNT_VALUES = ("alice", "bob")
ACCOUNTS = st.sampled_from(ACCOUNT_VALUES)
ROOTS = st.sampled_from(["/p", "/q"])
# A small clock range, so ties on updated_ms are common.
TIMES = st.integers(min_value=0, max_value=20)


@st.composite
def _records(draw: st.DrawFn) -> TaskRecord:
    """Rows in every state a sweep or a provisional deletion must tell apart (renamed or
    not, grace running, expired or absent), not only those reachable through the rules."""
    external = draw(st.booleans())
    user_renamed = draw(st.booleans())
    now = draw(TIMES)
    return TaskRecord(
        id=draw(TASK_IDS),
        account=draw(ACCOUNTS),
        root=draw(ROOTS),
        title="named" if user_renamed else "",
        user_renamed=user_renamed,
        created_ms=now,
        updated_ms=now,
        policy=draw(st.sampled_from(TaskPolicy)),
        surface=TaskSurface.EXTERNAL if external else TaskSurface.DESKTOP,
        provisional=external,
        provisional_expires_ms=draw(st.none() | TIMES) if external else None,
    )


RECORDS = _records()


def run(work: Callable[[], Awaitable[T]]) -> T:
    return trio.run(work)


@attrs.define
class ModelTask:
    record: TaskRecord
    #: The row as it was created: what a creating lease would compare on close.
    snapshot: TaskRecord
    items: list[tuple[str, str]] = attrs.Factory(list)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # A real file on tmpfs when there is one: each example opens and closes a store, and
        # on a disk every close pays a checkpoint's fsync. Durability has its own test.
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.directory = Path(tempfile.mkdtemp(prefix="store-machine-", dir=base))
        self.store = run(lambda: open_temp_store(self.directory))
        self.model: dict[str, ModelTask] = {}

    def teardown(self) -> None:
        run(self.store.aclose)
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- rules ---------------------------------------------------------------------------

    def _create(self, record: TaskRecord) -> None:
        if record.id in self.model:
            with pytest.raises(StoreError):
                run(lambda: self.store.create_task(record))
            return
        run(lambda: self.store.create_task(record))
        self.model[record.id] = ModelTask(record=record, snapshot=record)

    @initialize(records=st.lists(RECORDS, max_size=len(TASK_ID_VALUES), unique_by=lambda r: r.id))
    def seed(self, records: list[TaskRecord]) -> None:
        # Start most examples with tasks in place, so the other rules meet rows at once.
        for record in records:
            self._create(record)

    @rule(record=RECORDS)
    def create(self, record: TaskRecord) -> None:
        self._create(record)

    def _append(self, task: ModelTask, item_id: str, text: str) -> None:
        for n, (existing, _) in enumerate(task.items):
            if existing == item_id:
                task.items[n] = (item_id, text)
                return
        task.items.append((item_id, text))

    def _pick(self, data: st.DataObject) -> str:
        """Mostly an existing task (so changes land), sometimes any id (so misses are
        exercised too)."""
        known = sorted(self.model)
        choices = st.one_of(st.sampled_from(known), TASK_IDS) if known else TASK_IDS
        return data.draw(choices, label="task_id")

    @rule(data=st.data(), item_id=ITEM_IDS, text=st.text(max_size=5), now=TIMES)
    def admit(self, data: st.DataObject, item_id: str, text: str, now: int) -> None:
        task_id = self._pick(data)
        item = TimelineItem(item_id=item_id, kind=ItemKind.USER, created_ms=now, text=text)
        if task_id not in self.model:
            with pytest.raises(StoreError):
                run(lambda: self.store.admit_user_message(task_id, item, now_ms=now))
            return
        returned = run(lambda: self.store.admit_user_message(task_id, item, now_ms=now))
        task = self.model[task_id]
        task.record = attrs.evolve(
            task.record, provisional=False, provisional_expires_ms=None, updated_ms=now
        )
        self._append(task, item_id, text)
        assert returned == task.record

    @rule(
        data=st.data(),
        batch=st.lists(st.tuples(ITEM_IDS, st.text(max_size=5)), max_size=3),
        now=TIMES,
    )
    def upsert(self, data: st.DataObject, batch: list[tuple[str, str]], now: int) -> None:
        task_id = self._pick(data)
        items = [
            TimelineItem(item_id=i, kind=ItemKind.ASSISTANT, created_ms=now, text=t)
            for i, t in batch
        ]
        if task_id not in self.model and batch:
            with pytest.raises(StoreError):
                run(lambda: self.store.upsert_items(task_id, items, now_ms=now))
            return
        run(lambda: self.store.upsert_items(task_id, items, now_ms=now))
        if not batch:
            return
        task = self.model[task_id]
        task.record = attrs.evolve(task.record, updated_ms=now)
        for item_id, text in batch:
            self._append(task, item_id, text)

    @rule(data=st.data(), title=st.text(max_size=5), by_user=st.booleans(), now=TIMES)
    def rename(self, data: st.DataObject, title: str, by_user: bool, now: int) -> None:
        task_id = self._pick(data)
        result = run(
            lambda: self.store.rename_task(task_id, title, user_renamed=by_user, now_ms=now)
        )
        if task_id not in self.model:
            assert result is None
            return
        task = self.model[task_id]
        task.record = attrs.evolve(task.record, title=title, user_renamed=by_user, updated_ms=now)
        assert result == task.record

    @rule(data=st.data(), expires=st.none() | TIMES)
    def set_expiry(self, data: st.DataObject, expires: int | None) -> None:
        task_id = self._pick(data)
        result = run(lambda: self.store.set_provisional_expiry(task_id, expires))
        if task_id not in self.model:
            assert result is None
            return
        task = self.model[task_id]
        if task.record.provisional:
            task.record = attrs.evolve(task.record, provisional_expires_ms=expires)
        assert result == task.record

    @rule(data=st.data(), archived=st.booleans(), now=TIMES)
    def archive(self, data: st.DataObject, archived: bool, now: int) -> None:
        task_id = self._pick(data)
        result = run(lambda: self.store.set_archived(task_id, archived, now_ms=now))
        if task_id not in self.model:
            assert result is None
            return
        task = self.model[task_id]
        task.record = attrs.evolve(task.record, archived=archived, updated_ms=now)
        assert result == task.record

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        task_id = self._pick(data)
        deleted = run(lambda: self.store.delete_task(task_id))
        assert deleted == (self.model.pop(task_id, None) is not None)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete_if_unchanged(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.model)))
        task = self.model[task_id]
        snapshot = data.draw(st.sampled_from([task.snapshot, task.record]))
        expected = snapshot == task.record and task.record.provisional and not task.items
        assert run(lambda: self.store.delete_task_if_unchanged(snapshot)) == expected
        if expected:
            del self.model[task_id]

    @rule(now=TIMES, stranded=st.booleans())
    def sweep(self, now: int, stranded: bool) -> None:
        def swept(t: ModelTask) -> bool:
            r = t.record
            expiry = r.provisional_expires_ms
            return (
                r.provisional
                and r.surface is TaskSurface.EXTERNAL
                and not r.user_renamed
                and not t.items
                and ((expiry is not None and expiry <= now) or (stranded and expiry is None))
            )

        expected = sorted(i for i, t in self.model.items() if swept(t))
        assert run(lambda: self.store.sweep_provisional(now_ms=now, stranded=stranded)) == expected
        for task_id in expected:
            del self.model[task_id]

    @rule()
    def reopen(self) -> None:
        run(self.store.aclose)
        self.store = run(lambda: open_temp_store(self.directory))

    @rule(
        account=ACCOUNTS,
        root=st.none() | ROOTS,
        policy=st.none() | st.sampled_from(TaskPolicy),
        include_provisional=st.booleans(),
        include_archived=st.booleans(),
        limit=st.integers(min_value=1, max_value=3),
    )
    def list_pages(
        self,
        account: str,
        root: str | None,
        policy: TaskPolicy | None,
        include_provisional: bool,
        include_archived: bool,
        limit: int,
    ) -> None:
        query = TaskQuery(
            account=account,
            root=root,
            policy=policy,
            include_provisional=include_provisional,
            include_archived=include_archived,
            limit=limit,
        )

        async def walk() -> list[TaskRecord]:
            found: list[TaskRecord] = []
            cursor = None
            while True:
                page = await self.store.list_tasks(attrs.evolve(query, cursor=cursor))
                assert len(page.tasks) <= limit
                found.extend(page.tasks)
                if page.next_cursor is None:
                    return found
                assert len(page.tasks) == limit
                # A cursor that does not advance would loop for ever; fail instead.
                assert len(found) <= len(self.model)
                cursor = page.next_cursor

        expected = sorted(
            (
                t.record
                for t in self.model.values()
                if t.record.account == account
                and (root is None or t.record.root == root)
                and (policy is None or t.record.policy == policy)
                and (include_provisional or not t.record.provisional)
                and (include_archived or not t.record.archived)
            ),
            key=lambda r: (r.updated_ms, r.id),
            reverse=True,
        )
        assert run(walk) == expected

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def rows_and_histories_match(self) -> None:
        async def check() -> None:
            # Few calls per step: this runs after every rule. A deleted task's items would
            # reappear in the history of a task re-created under its id, so leftovers are
            # caught there.
            stored: dict[str, TaskRecord] = {}
            for account in ACCOUNT_VALUES:
                page = await self.store.list_tasks(
                    TaskQuery(account=account, include_provisional=True, include_archived=True)
                )
                stored.update((t.id, t) for t in page.tasks)
            assert stored == {task_id: t.record for task_id, t in self.model.items()}
            for task_id, task in self.model.items():
                history = await self.store.history(task_id)
                assert [(i.item_id, i.text) for i in history] == task.items
                assert [i.seq for i in history] == sorted({i.seq for i in history})

        run(check)


#: Examples in the default suite (same draw every run); the "long" profile's count
#: (``nox -s long``) replaces it when that profile is loaded.
DEFAULT_EXAMPLES = 60

StoreMachine.TestCase.settings = settings(
    max_examples=settings().max_examples
    if os.environ.get("HYPOTHESIS_PROFILE") == "long"
    else DEFAULT_EXAMPLES,
    stateful_step_count=25,
)
test_store_state_machine = StoreMachine.TestCase
