"""A smoke test against a real endpoint, run only when one is named:

    MAPLE_ACP_LIVE_BASE_URL=http://localhost:11434/v1 MAPLE_ACP_LIVE_MODEL=qwen2.5-coder \\
    [MAPLE_ACP_LIVE_API_KEY_ENV=OPENAI_API_KEY] pytest tests/backends/openai/test_provider_live.py

It drives one prompt and one file-reading turn through the real runtime and SQLite store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from maple_acp.backends import build_backend, provider_config_from_flags, provider_policy
from maple_acp.runtime import RunState, TextChunk, ToolRow
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service, run_prompt
from maple_acp.testing.store import temp_store

BASE_URL = os.environ.get("MAPLE_ACP_LIVE_BASE_URL")
MODEL = os.environ.get("MAPLE_ACP_LIVE_MODEL")
KEY_ENV = os.environ.get("MAPLE_ACP_LIVE_API_KEY_ENV")

pytestmark = pytest.mark.skipif(
    not (BASE_URL and MODEL),
    reason="set MAPLE_ACP_LIVE_BASE_URL and MAPLE_ACP_LIVE_MODEL to run against a real endpoint",
)


async def test_a_real_endpoint_answers_and_uses_a_tool(tmp_path: Path, project: Path) -> None:
    assert BASE_URL is not None
    assert MODEL is not None
    (project / "secret-word.txt").write_text("periwinkle\n")
    config = provider_config_from_flags(BASE_URL, MODEL, api_key_env=KEY_ENV)
    backend, catalog = build_backend(config, os.environ)
    async with backend, temp_store(tmp_path) as store:
        service = make_demo_service(
            store, backend=backend, catalog=catalog, policy=provider_policy()
        )
        async with service, trio.open_nursery() as nursery:
            service.sign_in(DEMO_ACCOUNT)
            lease = await nursery.start(service.serve_new_task, str(project))
            with trio.fail_after(180):
                events, outcome = await run_prompt(lease, "Reply with exactly one word: pong")
            assert outcome.state is RunState.COMPLETED, outcome.failure
            assert "".join(e.text for e in events if isinstance(e, TextChunk)).strip()
            with trio.fail_after(300):
                events, outcome = await run_prompt(
                    lease,
                    "Use the read_file tool to read secret-word.txt, then tell me the word.",
                )
            assert outcome.state is RunState.COMPLETED, outcome.failure
            reads = [e for e in events if isinstance(e, ToolRow) and e.tool.name == "read_file"]
            text = "".join(e.text for e in events if isinstance(e, TextChunk)).lower()
            assert reads, "the model did not call read_file"
            assert "periwinkle" in text
            await lease.release(close=False)
