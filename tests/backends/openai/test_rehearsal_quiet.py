"""The in-memory rehearsal of the SDK's first request (made in a worker thread when a host
starts serving) is not logged as a request: at DEBUG it used to show as a real ``POST
http://rehearsal.invalid/...``. A real request's lines, at the same level, still are."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from loopback import LoopbackProvider, text_reply
from provider_support import one_turn, provider_service

from maple_acp.backends.openai._client import rehearse_request


async def test_the_rehearsal_leaves_no_request_in_the_log(
    tmp_path: Path,
    provider: LoopbackProvider,
    project: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await trio.to_thread.run_sync(rehearse_request)
    assert not [r for r in caplog.records if "rehearsal.invalid" in r.getMessage()]
    provider.add(text_reply("hello"))
    async with provider_service(tmp_path, provider) as service:
        with trio.fail_after(20):
            await one_turn(service, project, "hi")
    real = [r.getMessage() for r in caplog.records if r.name == "httpx2"]
    assert [line for line in real if f"POST {provider.base_url}/chat/completions" in line]
    assert not [r for r in caplog.records if "rehearsal.invalid" in r.getMessage()]
