"""A smoke test against Anthropic's real Messages API, run only when a key variable is named:

    MAPLE_ACP_LIVE_ANTHROPIC_KEY_ENV=ANTHROPIC_API_KEY \\
    [MAPLE_ACP_LIVE_ANTHROPIC_MODEL=claude-sonnet-4-5] \\
    [MAPLE_ACP_LIVE_ANTHROPIC_BASE_URL=https://api.anthropic.com/v1] \\
    pytest tests/backends/anthropic/test_messages_live.py

It drives one prompt and one file-reading turn, with thinking, through the real runtime and
SQLite store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from maple_acp.backends import build_backend, load_provider_config, provider_policy
from maple_acp.runtime import RunState, TextChunk, ToolRow
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service, run_prompt
from maple_acp.testing.store import temp_store

KEY_ENV = os.environ.get("MAPLE_ACP_LIVE_ANTHROPIC_KEY_ENV")
MODEL = os.environ.get("MAPLE_ACP_LIVE_ANTHROPIC_MODEL", "claude-sonnet-4-5")
BASE_URL = os.environ.get("MAPLE_ACP_LIVE_ANTHROPIC_BASE_URL", "https://api.anthropic.com/v1")

pytestmark = pytest.mark.skipif(
    not KEY_ENV, reason="set MAPLE_ACP_LIVE_ANTHROPIC_KEY_ENV to run against the real API"
)


async def test_the_real_api_answers_thinks_and_uses_a_tool(tmp_path: Path, project: Path) -> None:
    assert KEY_ENV is not None
    (project / "secret-word.txt").write_text("periwinkle\n")
    raw = {
        "providers": [
            {
                "name": "claude",
                "kind": "anthropic",
                "base_url": BASE_URL,
                "api_key_env": KEY_ENV,
                "models": [{"id": MODEL, "reasoning": True, "context_window": 200_000}],
            }
        ]
    }
    backend, catalog = build_backend(load_provider_config(raw, "live test"), os.environ)
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
            await lease.set_thought_level("low")
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
