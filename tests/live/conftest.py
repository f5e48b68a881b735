"""The live tier: a real inference server behind the host. Run it with ``nox -s live_local``,
which installs the server and the model and sets ``MAPLE_ACP_LIVE_LOCAL=1``; a plain
``pytest`` run skips these tests, saying so.

Figures the tests measure (first-chunk latency, tokens/s, the server's memory) are printed at
the end of the run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import trio

from .local_server import LocalServer, local_server
from .recording_proxy import RecordingProxy

#: Set by ``nox -s live_local``; the suite's isolation keeps ``MAPLE_ACP_LIVE_*`` names.
OPT_IN: Final = "MAPLE_ACP_LIVE_LOCAL"
HERE: Final = Path(__file__).parent

#: What the tests measured, printed at the end of the run.
FIGURES: dict[str, Any] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(OPT_IN) == "1":
        return
    skip = pytest.mark.skip(reason=f"the live tier runs with `nox -s live_local` ({OPT_IN}=1)")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("live figures")
    for name, value in FIGURES.items():
        terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LocalServer]:
    directory = Path(tempfile.mkdtemp(prefix="macp-llama-"))
    with local_server(directory) as server:
        yield server
        memory = server.memory_kib()
        FIGURES["server memory (MiB)"] = (
            f"resident {memory['VmRSS'] / 1024:.0f}, peak {memory['VmHWM'] / 1024:.0f}"
        )


@pytest.fixture
async def proxy(llama_server: LocalServer) -> AsyncIterator[RecordingProxy]:
    """A recording proxy in front of the server, in a nursery of its own."""
    recording = RecordingProxy("127.0.0.1", llama_server.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(recording.serve)
        yield recording
        nursery.cancel_scope.cancel()
