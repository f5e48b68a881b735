"""Stop the ACP service before the runtime, and say which of the two failed."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs

from maple_acp.edge._service import AcpService
from maple_acp.runtime import AgentService

logger = logging.getLogger(__name__)


@attrs.frozen
class ShutdownReport:
    """What happened to each half of a host shutdown step. ``None`` means it succeeded."""

    acp_error: BaseException | None = None
    runtime_error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.acp_error is None and self.runtime_error is None


class HostLifecycle:
    """Composes the two services in the order the host must respect: the ACP edge is stopped
    first (so no client can start work in a runtime that is going away), then the runtime.

    Each step runs both halves even if the first fails, and returns a :class:`ShutdownReport`
    naming every failure; none is swallowed into a log line only.
    """

    def __init__(self, runtime: AgentService, acp: AcpService) -> None:
        self.runtime = runtime
        self.acp = acp

    async def _two_step(self, runtime_step: Callable[[], Awaitable[object]]) -> ShutdownReport:
        acp_error: BaseException | None = None
        runtime_error: BaseException | None = None
        try:
            # Not the user's choice to disable the service: keep "enabled" for restore.
            await self.acp.stop(persist=False)
        except Exception as exc:
            logger.error("stopping the ACP service failed", exc_info=exc)
            acp_error = exc
        try:
            await runtime_step()
        except Exception as exc:
            logger.error("stopping the runtime failed", exc_info=exc)
            runtime_error = exc
        return ShutdownReport(acp_error, runtime_error)

    async def shutdown(self) -> ShutdownReport:
        """Host exit or runtime stop: stop ACP, then drain the runtime."""
        return await self._two_step(self.runtime.drain)

    async def sign_out(self) -> ShutdownReport:
        async def step() -> None:
            self.runtime.sign_out()

        return await self._two_step(step)

    async def switch_account(self, account: str) -> ShutdownReport:
        async def step() -> None:
            self.runtime.sign_in(account)

        return await self._two_step(step)
