"""The listeners one host runs for one service, beside the service rather than inside it: each
started in the host's nursery in a cancel scope of its own, where it serves once it reports
ready, and all of them ended together."""

from __future__ import annotations

import attrs
import trio

from maple_acp.listeners._shape import ConnectionHost, Listener


@attrs.define(eq=False)
class _Run:
    """One running listener: its cancel scope, where it serves once ready, when it stopped."""

    listener: Listener
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    stopped: trio.Event = attrs.field(factory=trio.Event)
    address: str | None = None


class _Ready:
    """The ``task_status`` a listener reports to: keeps its address, then tells the starter."""

    def __init__(self, run: _Run, started: trio.TaskStatus[str]) -> None:
        self._run = run
        self._started = started

    def started(self, value: str | None = None) -> None:
        if value is None:
            raise TypeError("a listener reports where it serves")
        self._run.address = value
        self._started.started(value)


class RunningListeners:
    """The listeners serving one :class:`ConnectionHost`, in the order they started."""

    def __init__(self, host: ConnectionHost) -> None:
        self._host = host
        self._runs: list[_Run] = []

    def __bool__(self) -> bool:
        return bool(self._runs)

    @property
    def addresses(self) -> tuple[str, ...]:
        """Where each ready listener serves, in the order they started."""
        return tuple(run.address for run in self._runs if run.address is not None)

    async def start(self, nursery: trio.Nursery, listener: Listener) -> str:
        """Start ``listener`` in ``nursery``; return where it serves once clients can connect.
        Whatever it refuses to start with propagates, and nothing is left listening."""
        address: str = await nursery.start(self._serve, listener)
        return address

    async def _serve(
        self, listener: Listener, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        run = _Run(listener)
        self._runs.append(run)
        try:
            with run.scope:
                await listener.serve(self._host, task_status=_Ready(run, task_status))
        finally:
            self._runs.remove(run)
            run.stopped.set()

    async def stop(self) -> None:
        """Cancel every listener running now; return once each has released what it bound."""
        runs = list(self._runs)
        for run in runs:
            run.scope.cancel()
        for run in runs:
            await run.stopped.wait()
