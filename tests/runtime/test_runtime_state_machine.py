"""A Hypothesis state machine over tasks, leases, runs, permissions, goals, re-attach,
delete, observers and background commands (real processes: no background command outlives its
lease).

Each step runs on one long-lived trio loop in a thread (``trio.from_thread.run``); each example
gets a fresh SQLite store and service. A "crash" snapshots the store's committed state (what a
WAL database holds after a SIGKILL) and opens a new service on the snapshot, abandoning the old
one.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import hypothesis.strategies as st
import trio
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from maple_acp.model import TaskQuery
from maple_acp.runtime import (
    AgentService,
    Observer,
    ObserverDetached,
    PermissionRequest,
    PermissionTicket,
    RejectionKind,
    Run,
    RunBatch,
    RuntimeRejection,
    SessionLease,
)
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.store import STORE_FILE_NAME, open_temp_store

T = TypeVar("T")


class _Loop:
    """One trio loop in a daemon thread, shared by every example."""

    def __init__(self) -> None:
        ready = threading.Event()
        self.token: Any = None
        self.nursery: trio.Nursery | None = None

        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                ready.set()
                await trio.sleep_forever()

        threading.Thread(target=trio.run, args=(main,), daemon=True).start()
        ready.wait()

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        return trio.from_thread.run(fn, trio_token=self.token)


_LOOP: _Loop | None = None


def loop() -> _Loop:
    global _LOOP
    if _LOOP is None:
        _LOOP = _Loop()
    return _LOOP


class CountingRouter:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def tool_definition(self) -> Any:
        return None

    async def call(self, tool_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(tool_id)
        await trio.lowlevel.checkpoint()
        return {"ok": True}

    def revoke(self) -> None:
        pass


class Host:
    """Everything of one service incarnation living in the loop."""

    def __init__(self, data: str) -> None:
        self.data = data
        self.scope = trio.CancelScope()
        self.service: AgentService | None = None
        self.nursery: trio.Nursery | None = None
        self.stopped = trio.Event()

    async def start(self) -> None:
        started = trio.Event()

        async def body() -> None:
            store = await open_temp_store(self.data)
            try:
                with self.scope:
                    async with trio.open_nursery() as nursery:
                        self.nursery = nursery
                        self.service = make_demo_service(store, provisional_grace_s=0)
                        await nursery.start(self.service.serve)
                        self.service.sign_in(DEMO_ACCOUNT)
                        started.set()
                        await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await store.aclose()
                self.stopped.set()

        nursery = loop().nursery
        assert nursery is not None
        nursery.start_soon(body)
        await started.wait()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()


class LeaseModel:
    def __init__(self, lease: SessionLease, router: CountingRouter) -> None:
        self.lease = lease
        self.router = router
        #: The pid files of the background commands this lease started (each command writes
        #: its own pid there before it becomes ``sleep``).
        self.background: list[str] = []


#: How long a background command in this machine would live unless something ends it.
BACKGROUND_SLEEP_S = 120
#: Real seconds a step waits for a background command to start or to be gone.
BACKGROUND_WAIT_S = 10.0


def pid_in(path: str) -> int | None:
    try:
        with open(path) as file:
            text = file.read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class RunModel:
    def __init__(self, run: Run, lease: LeaseModel) -> None:
        self.run = run
        self.lease = lease
        # The router of the run's lease when it started (a re-attach may replace it later).
        self.router = lease.router
        self.requests: list[PermissionRequest] = []
        self.used: list[PermissionRequest] = []
        self.fenced = False  # cancelled or revoked: no allow may take effect from now on
        self.calls_when_fenced = 0


class ObserverModel:
    """A window following a lease it does not hold, and the questions its feed brought."""

    def __init__(self, observer: Observer, lease: LeaseModel) -> None:
        self.observer = observer
        self.lease = lease
        self.requests: list[PermissionRequest] = []
        self.used: list[PermissionRequest] = []


SCRIPTS = ["hello", "/hang", "/mcp srv__t {}", "/usage 1 2\n/mcp srv__t {}", "/goal hang on"]


class RuntimeMachine(RuleBasedStateMachine):
    leases = Bundle("leases")
    runs = Bundle("runs")
    observers = Bundle("observers")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="maple-sm-")
        self.data = os.path.join(self.tmp, "data")
        os.mkdir(self.data)
        self.roots = []
        for name in ("a", "b"):
            root = os.path.join(self.tmp, name)
            os.mkdir(root)
            self.roots.append(os.path.realpath(root))
        self.host: Host | None = None
        self.all_leases: list[LeaseModel] = []
        self.all_runs: list[RunModel] = []
        self.admitted: dict[str, list[str]] = {}
        self.locked_model: dict[str, str | None] = {}
        self.known_tasks: set[str] = set()
        self.deleted: set[str] = set()
        self.drained = False
        self.all_observers: list[ObserverModel] = []
        #: For each permission request (its responder's id): the answers that decided it.
        self.decisions: dict[str, list[str]] = {}
        self.background_serial = 0

    # -- plumbing ------------------------------------------------------------------------

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return loop().run(fn)

    def sync(self, fn: Callable[[], object]) -> None:
        """Run a synchronous runtime call on the loop (trio objects are not thread-safe)."""

        async def go() -> None:
            fn()
            await trio.testing.wait_all_tasks_blocked()

        self.call(go)

    @property
    def service(self) -> AgentService:
        assert self.host is not None
        assert self.host.service is not None
        return self.host.service

    def _start_host(self) -> None:
        host = Host(self.data)

        self.call(host.start)
        self.host = host

    @initialize()
    def boot(self) -> None:
        self._start_host()

    def teardown(self) -> None:
        try:
            if self.host is not None:
                host = self.host
                self.call(host.stop)
                self._check_background_gone(self.all_leases)
        finally:
            for model in self.all_leases:
                for path in model.background:
                    pid = pid_in(path)
                    if pid is not None and alive(pid):
                        os.kill(pid, 9)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _pump(self, model: RunModel) -> None:
        async def pump() -> None:
            async for event in model.run.events():
                if isinstance(event, PermissionRequest):
                    model.requests.append(event)

        assert self.host is not None
        assert self.host.nursery is not None
        self.host.nursery.start_soon(pump)

    # -- rules -----------------------------------------------------------------------------

    @precondition(lambda self: not self.drained)
    @rule(target=leases, root=st.sampled_from([0, 1]))
    def new_lease(self, root: int) -> Any:
        router = CountingRouter()

        async def factory(nursery: trio.Nursery, task_id: str) -> CountingRouter:
            return router

        async def go() -> SessionLease | None:
            assert self.host is not None
            assert self.host.nursery is not None
            try:
                made: SessionLease = await self.host.nursery.start(
                    lambda task_status: self.service.serve_new_task(
                        self.roots[root], router_factory=factory, task_status=task_status
                    )
                )
                return made
            except RuntimeRejection as exc:
                kind = exc.kind
            assert kind in (RejectionKind.NOT_SIGNED_IN, RejectionKind.SHUTTING_DOWN)
            return None

        lease = self.call(go)
        if lease is None:
            return None
        self.known_tasks.add(lease.task_id)
        model = LeaseModel(lease, router)
        self.all_leases.append(model)
        return model

    @precondition(lambda self: not self.drained)
    @rule(target=leases, task=st.integers(0, 5))
    def attach(self, task: int) -> Any:
        tasks = sorted(self.known_tasks | self.deleted)
        if not tasks:
            return None
        task_id = tasks[task % len(tasks)]
        router = CountingRouter()

        async def factory(nursery: trio.Nursery, task_id: str) -> CountingRouter:
            return router

        async def go() -> SessionLease | RuntimeRejection:
            assert self.host is not None
            assert self.host.nursery is not None
            stored = await self.service.store.get_task(task_id)
            root = stored.root if stored is not None else self.roots[0]
            try:
                attached: SessionLease = await self.host.nursery.start(
                    lambda task_status: self.service.serve_task(
                        task_id, root, router_factory=factory, task_status=task_status
                    )
                )
                return attached
            except RuntimeRejection as exc:
                return exc

        result = self.call(go)
        # A deleted task never comes back.
        assert task_id not in self.deleted or isinstance(result, RuntimeRejection)
        if isinstance(result, RuntimeRejection):
            holders = [
                m for m in self.all_leases if m.lease.task_id == task_id and not m.lease.released
            ]
            if result.kind in (RejectionKind.TASK_LEASED, RejectionKind.RUN_ACTIVE):
                assert holders, "refused as held, but no lease holds the task"
            else:
                assert result.kind in (
                    RejectionKind.TASK_NOT_FOUND,
                    RejectionKind.NOT_SIGNED_IN,
                    RejectionKind.SHUTTING_DOWN,
                ), result
            return None
        model = LeaseModel(result, router)
        self.all_leases.append(model)
        return model

    @rule(target=runs, lease=leases, script=st.sampled_from(SCRIPTS))
    def start_run(self, lease: LeaseModel | None, script: str) -> Any:
        if lease is None:
            return None

        holder: list[RunModel] = []

        async def go() -> RuntimeRejection | None:
            try:
                run = await lease.lease.start_run(script)
            except RuntimeRejection as exc:
                return exc
            model = RunModel(run, lease)
            holder.append(model)
            self._pump(model)
            await trio.testing.wait_all_tasks_blocked()
            return None

        result = self.call(go)
        if result is not None:
            assert result.kind in (
                RejectionKind.RUN_ACTIVE,
                RejectionKind.LEASE_REVOKED,
                RejectionKind.ACCOUNT_CHANGED,
                RejectionKind.NOT_SIGNED_IN,
                RejectionKind.SHUTTING_DOWN,
            ), result
            return None
        task_id = lease.lease.task_id
        self.admitted.setdefault(task_id, []).append(script)
        self.locked_model.setdefault(task_id, lease.lease.task.model)
        self.all_runs.append(holder[0])
        return holder[0]

    @rule(run=runs, form=st.sampled_from(["allow", "deny", "unknown", "bad", "reuse", "cross"]))
    def answer(self, run: RunModel | None, form: str) -> None:
        if run is None:
            return

        async def go() -> None:
            await trio.testing.wait_all_tasks_blocked()
            fresh = [r for r in run.requests if r not in run.used]
            if form == "unknown":
                assert not run.run.answer("nope", "allow_once")
                self._fence(run)
            elif form == "reuse" and run.used:
                assert not run.used[0].responder.answer("allow_once")
                self._fence(run)
            elif form == "cross":
                others = [r for m in self.all_runs if m is not run for r in m.requests]
                if others:
                    assert not run.run.answer(others[0].responder.id, "allow_once")
                    self._fence(run)
            elif fresh:
                request = fresh[0]
                run.used.append(request)
                option = {"allow": "allow_once", "deny": "deny_once"}.get(form, "sometimes")
                accepted = request.responder.answer(option)
                self._decided(request, option, accepted)
                if run.fenced or option == "sometimes":
                    assert not accepted
                    # Another window may still answer: only the last one's giving up denies.
                    if request.responder.done.is_set():
                        self._fence(run)
            await trio.testing.wait_all_tasks_blocked()

        self.call(go)

    def _decided(self, request: PermissionRequest, option: str, accepted: bool) -> None:
        if accepted:
            self.decisions.setdefault(request.responder.id, []).append(option)

    # -- observers -----------------------------------------------------------------------

    @rule(target=observers, lease=leases)
    def attach_observer(self, lease: LeaseModel | None) -> Any:
        if lease is None:
            return None
        made: list[ObserverModel] = []

        async def go() -> RuntimeRejection | None:
            try:
                observer = lease.lease.attach_observer()
            except RuntimeRejection as exc:
                return exc
            model = ObserverModel(observer, lease)
            made.append(model)

            async def follow() -> None:
                async for item in observer:
                    if isinstance(item, RunBatch):
                        model.requests.extend(
                            e for e in item.events if isinstance(e, PermissionRequest)
                        )
                    elif isinstance(item, ObserverDetached):
                        return

            assert self.host is not None
            assert self.host.nursery is not None
            self.host.nursery.start_soon(follow)
            await trio.testing.wait_all_tasks_blocked()
            return None

        result = self.call(go)
        if result is not None:
            assert result.kind in (
                RejectionKind.OBSERVERS_FULL,
                RejectionKind.LEASE_REVOKED,
                RejectionKind.ACCOUNT_CHANGED,
                RejectionKind.NOT_SIGNED_IN,
                RejectionKind.SHUTTING_DOWN,
            ), result
            if result.kind is RejectionKind.OBSERVERS_FULL:
                assert lease.lease.observers == 4
            return None
        self.all_observers.append(made[0])
        return made[0]

    @rule(observer=consumes(observers))
    def detach_observer(self, observer: ObserverModel | None) -> None:
        if observer is None:
            return
        self.sync(observer.observer.detach)

    @rule(observer=observers, form=st.sampled_from(["allow", "deny", "cancel"]))
    def answer_from_observer(self, observer: ObserverModel | None, form: str) -> None:
        if observer is None:
            return

        async def go() -> None:
            await trio.testing.wait_all_tasks_blocked()
            fresh = [r for r in observer.requests if r not in observer.used]
            if not fresh:
                return
            request = fresh[0]
            observer.used.append(request)
            option = {"allow": "allow_once", "deny": "deny_once"}.get(form)
            assert isinstance(request.responder, PermissionTicket)
            accepted = request.responder.answer(option)  # type: ignore[arg-type]
            self._decided(request, form + "_once" if option else "cancel", accepted)
            runs = [m for m in self.all_runs if m.run.id == request.run_id]
            if runs and (runs[0].fenced or option is None):
                assert not accepted or not runs[0].fenced
                if option is None and request.responder.done.is_set():
                    self._fence(runs[0])
            await trio.testing.wait_all_tasks_blocked()

        self.call(go)

    def _fence(self, run: RunModel) -> None:
        if not run.fenced:
            run.fenced = True
            run.calls_when_fenced = len(run.router.calls)

    @rule(run=runs)
    def cancel(self, run: RunModel | None) -> None:
        if run is None:
            return
        self._fence(run)
        self.sync(run.run.cancel)

    @rule(lease=leases)
    def start_background(self, lease: LeaseModel | None) -> None:
        """A prompt whose one line starts a background command, allowed at once."""
        if lease is None:
            return
        self.background_serial += 1
        pid_file = os.path.join(self.tmp, f"bg-{self.background_serial}.pid")
        run = self.start_run(lease, f"/bg echo $$ > {pid_file}; exec sleep {BACKGROUND_SLEEP_S}")
        if run is None:
            return

        async def go() -> None:
            with trio.move_on_after(BACKGROUND_WAIT_S):
                while not run.requests and not run.run.ended:  # noqa: ASYNC110 - a pump's list
                    await trio.sleep(0.01)
            fresh = [r for r in run.requests if r not in run.used]
            if not fresh:
                return  # ended first (revoked, cancelled): nothing was started
            run.used.append(fresh[0])
            accepted = fresh[0].responder.answer("allow_once")
            self._decided(fresh[0], "allow_once", accepted)
            if not accepted:
                return
            with trio.move_on_after(BACKGROUND_WAIT_S):
                while pid_in(pid_file) is None and not lease.lease.released:  # noqa: ASYNC110 - on disk
                    await trio.sleep(0.01)

        self.call(go)
        if pid_in(pid_file) is not None:
            lease.background.append(pid_file)

    @rule(lease=leases)
    def stop_background(self, lease: LeaseModel | None) -> None:
        if lease is None or lease.lease.revoked:
            return
        try:
            listed = lease.lease.background_commands()
        except RuntimeRejection:
            return  # not serving (drained, signed out): nothing to list
        running = [c for c in listed if c.status == "running"]
        if not running:
            return
        handle = running[0].handle
        pids = [pid for path in lease.background if (pid := pid_in(path)) is not None]

        def still_running() -> list[str]:
            return [c.handle for c in lease.lease.background_commands() if c.status == "running"]

        async def go() -> None:
            lease.lease.stop_background(handle)
            with trio.move_on_after(BACKGROUND_WAIT_S):
                while handle in still_running():  # noqa: ASYNC110 - a process's end, outside
                    await trio.sleep(0.01)

        self.call(go)
        assert handle not in still_running()
        # The stopped one is gone; as many as are still listed running remain.
        assert sum(alive(pid) for pid in pids) == len(still_running()), pids

    def _check_background_gone(self, models: list[LeaseModel]) -> None:
        """No background command outlives its lease: once the lease is released, each pid
        it started is gone (reaped, not a zombie)."""
        for model in models:
            for path in model.background:
                pid = pid_in(path)
                assert pid is not None
                assert not alive(pid), f"background pid {pid} outlived its lease"

    @rule(lease=leases)
    def revoke(self, lease: LeaseModel | None) -> None:
        if lease is None:
            return
        for run in self.all_runs:
            if run.lease is lease:
                self._fence(run)
        self.sync(lease.lease.revoke)

    @rule(lease=consumes(leases), close=st.booleans())
    def release(self, lease: LeaseModel | None, close: bool) -> None:
        if lease is None:
            return
        for run in self.all_runs:
            if run.lease is lease:
                self._fence(run)
        self.call(lambda: lease.lease.release(close=close))
        assert lease.lease.released
        self._check_background_gone([lease])

    @rule(lease=leases, fails=st.booleans())
    def reattach(self, lease: LeaseModel | None, fails: bool) -> None:
        if lease is None:
            return
        router = CountingRouter()

        async def factory(nursery: trio.Nursery, task_id: str) -> CountingRouter:
            await trio.lowlevel.checkpoint()
            if fails:
                raise OSError("the new servers did not answer")
            return router

        async def go() -> BaseException | None:
            try:
                await lease.lease.replace_router(factory)
            except (RuntimeRejection, OSError) as exc:
                return exc
            return None

        result = self.call(go)
        if result is None:
            assert not fails
            assert lease.lease.tools.router is router
            lease.router = router
        elif isinstance(result, OSError):
            # The old router stays.
            assert lease.lease.tools.router is lease.router
        else:
            assert isinstance(result, RuntimeRejection)
            assert result.kind in (
                RejectionKind.RUN_ACTIVE,
                RejectionKind.LEASE_REVOKED,
                RejectionKind.ACCOUNT_CHANGED,
                RejectionKind.NOT_SIGNED_IN,
                RejectionKind.SHUTTING_DOWN,
            ), result

    @rule(task=st.integers(0, 5))
    def delete(self, task: int) -> None:
        tasks = sorted(self.known_tasks | self.deleted)
        if not tasks:
            return
        task_id = tasks[task % len(tasks)]

        async def go() -> RuntimeRejection | None:
            try:
                await self.service.delete_task(task_id)
            except RuntimeRejection as exc:
                return exc
            return None

        holders = [
            m for m in self.all_leases if m.lease.task_id == task_id and not m.lease.released
        ]
        result = self.call(go)
        if result is None:
            assert not holders, "a held task was deleted"
            assert task_id not in self.deleted
            self.deleted.add(task_id)
            self.known_tasks.discard(task_id)
            self.admitted.pop(task_id, None)
            self.locked_model.pop(task_id, None)
        elif result.kind in (RejectionKind.TASK_LEASED, RejectionKind.RUN_ACTIVE):
            assert holders, "refused as held, but no lease holds the task"
        else:
            assert result.kind in (
                RejectionKind.TASK_NOT_FOUND,
                RejectionKind.NOT_SIGNED_IN,
                RejectionKind.SHUTTING_DOWN,
            ), result

    @rule(lease=leases, model=st.sampled_from(["demo-echo", "demo-echo-large"]))
    def set_model(self, lease: LeaseModel | None, model: str) -> None:
        if lease is None:
            return

        async def go() -> None:
            kind = None
            try:
                await lease.lease.set_model(model)
            except RuntimeRejection as exc:
                kind = exc.kind
            assert kind is not RejectionKind.UNKNOWN_MODEL

        self.call(go)

    @rule(lease=leases, action=st.sampled_from(["set", "pause", "resume", "clear"]))
    def goal(self, lease: LeaseModel | None, action: str) -> None:
        if lease is None:
            return

        async def go() -> None:
            try:
                if action == "set":
                    await lease.lease.set_goal("hang here")
                else:
                    await getattr(lease.lease, f"{action}_goal")()
            except RuntimeRejection:
                pass
            # A cycle's events must be read like a prompt's.
            await trio.testing.wait_all_tasks_blocked()

        self.call(go)

    @rule()
    def sign_out_and_in(self) -> None:
        for run in self.all_runs:
            self._fence(run)
        self.sync(self.service.sign_out)
        self.sync(lambda: self.service.sign_in(DEMO_ACCOUNT))

    @precondition(lambda self: not self.drained)
    @rule()
    def drain(self) -> None:
        for run in self.all_runs:
            self._fence(run)
        self.call(self.service.drain)
        self.drained = True

    @rule()
    def sweep(self) -> None:
        if self.drained:
            return
        self.call(self.service.sweep_provisional)

    @rule()
    def crash_and_reopen(self) -> None:
        assert self.host is not None
        old = self.host
        path = os.path.join(self.data, STORE_FILE_NAME)
        snapshot_dir = tempfile.mkdtemp(dir=self.tmp)
        snapshot = os.path.join(snapshot_dir, STORE_FILE_NAME)

        def copy() -> None:
            source = sqlite3.connect(path)
            target = sqlite3.connect(snapshot)
            with target:
                source.backup(target)
            source.close()
            target.close()

        async def crash() -> None:
            await trio.to_thread.run_sync(copy)

        self.call(crash)
        for run in self.all_runs:
            self._fence(run)
        # Whatever the old incarnation does from here on happens to a discarded file.
        self.call(old.stop)
        for model in self.all_leases:
            assert model.lease.released
        self._check_background_gone(self.all_leases)
        self.data = snapshot_dir
        self.all_leases = []
        self.all_runs_before_crash = self.all_runs
        self.all_runs = []
        self.drained = False
        self._start_host()
        self._check_durable()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def one_lease_per_task(self) -> None:
        held: dict[str, int] = {}
        for model in self.all_leases:
            if not model.lease.released:
                held[model.lease.task_id] = held.get(model.lease.task_id, 0) + 1
        assert all(count == 1 for count in held.values()), held

    @invariant()
    def one_active_run_per_task(self) -> None:
        active: dict[str, int] = {}
        for model in self.all_runs:
            if not model.run.ended:
                active[model.run.task_id] = active.get(model.run.task_id, 0) + 1
        assert all(count == 1 for count in active.values()), active

    @invariant()
    def one_answer_per_permission_request_reaches_the_runtime(self) -> None:
        for decided in self.decisions.values():
            assert len(decided) <= 1, decided
        for model in self.all_observers:
            for request in model.requests:
                ticket = request.responder
                assert isinstance(ticket, PermissionTicket)
                decided = self.decisions.get(ticket.id, [])
                if decided and not ticket.cancelled:
                    # The question's outcome is the one answer that decided it.
                    assert ticket.allowed == (decided[0] == "allow_once")

    @invariant()
    def no_observer_keeps_a_lease(self) -> None:
        for model in self.all_observers:
            lease = model.lease.lease
            if lease.revoked:
                assert model.observer.detached is not None
            # The holder's lease is the only one of its task.
            assert self.service.lease_of(lease.task_id) in (lease, None) or lease.released
        for lease_model in self.all_leases:
            attached = [
                m
                for m in self.all_observers
                if m.lease is lease_model and m.observer.detached is None
            ]
            assert lease_model.lease.observers == len(attached)

    @invariant()
    def no_allow_after_cancel_or_revoke(self) -> None:
        for run in self.all_runs:
            if run.fenced:
                assert len(run.router.calls) == run.calls_when_fenced

    def _check_durable(self) -> None:
        async def read() -> None:
            store = self.service.store
            page_ids = set()
            query = TaskQuery(account=DEMO_ACCOUNT, include_provisional=True, limit=100)
            page = await store.list_tasks(query)
            page_ids = {task.id for task in page.tasks}
            for task_id in self.deleted:
                assert task_id not in page_ids
                assert await store.get_task(task_id) is None
                assert await store.history(task_id) == []
            for task_id in self.known_tasks:
                texts = self.admitted.get(task_id, [])
                if not texts:
                    continue
                # No admitted message is lost; a task with one is never deleted.
                assert task_id in page_ids
                history = await store.history(task_id)
                users = [item.text for item in history if item.kind.value == "user"]
                assert users == texts
                task = await store.get_task(task_id)
                assert task is not None
                assert not task.provisional
                # The model locked by the first message never changes.
                assert task.model == self.locked_model[task_id]

        self.call(read)

    @invariant()
    def durable_state(self) -> None:
        if self.host is not None and self.host.service is not None:
            self._check_durable()


#: Examples in the default suite (same draw every run); ``nox -s long`` explores 5000 fresh ones.
DEFAULT_EXAMPLES = 100

RuntimeMachine.TestCase.settings = settings(
    max_examples=50
    if os.environ.get("SM_QUICK")
    else 5000
    if os.environ.get("HYPOTHESIS_PROFILE") == "long"
    else DEFAULT_EXAMPLES,
    stateful_step_count=12,
    deadline=None,
)
TestRuntimeMachine = RuntimeMachine.TestCase
