"""The harness the edge tests share (a module, not conftest: several test directories have a
conftest, and only a uniquely named module imports reliably)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.service import AcpHarness, running_demo_acp

Harness = AcpHarness


@asynccontextmanager
async def running_service(
    tmp_path: Path, *, config: AcpServiceConfig | None = None, **runtime_options: Any
) -> AsyncIterator[AcpHarness]:
    """The demo service, allowing the ``RELAY_TOKEN`` relay value the edge tests use."""
    runtime_options.setdefault("relay_allow_list", ("RELAY_TOKEN",))
    async with running_demo_acp(tmp_path, config=config, **runtime_options) as harness:
        yield harness
