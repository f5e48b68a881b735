"""Unknown is not zero: a provider that reports no usage (llama.cpp's Python server sends none
in a stream) gets a prompt answer without ``usage`` and a log line saying it was not reported,
never counts of zero; one that reports usage still gets it. Through ACP."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from loopback import LoopbackProvider, text_reply
from test_provider_acp import provider_acp

from maple_acp.testing.schema import AcpSchema


async def test_no_usage_from_the_provider_is_none_in_the_answer_and_the_log(
    tmp_path: Path,
    provider: LoopbackProvider,
    project: Path,
    acp_schema: AcpSchema,
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider.add(text_reply("Hello", usage=None), text_reply("Again", usage=(12, 3)))
    caplog.set_level(logging.INFO, logger="maple_acp.runtime")
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        unreported = await client.prompt(sid, "hi")
        reported = await client.prompt(sid, "again")
        client.validate(acp_schema)
    assert unreported == {"stopReason": "end_turn"}
    assert reported["usage"]["inputTokens"] == 12
    assert reported["usage"]["outputTokens"] == 3
    ended = [r.getMessage() for r in caplog.records if " ended: " in r.getMessage()]
    assert len(ended) == 2
    assert ended[0].endswith("tokens not reported")
    assert ended[1].endswith("tokens in 12 out 3 total 15")
    assert not [line for line in ended if "tokens in 0 out 0" in line]
