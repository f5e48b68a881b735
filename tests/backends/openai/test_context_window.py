"""A request that cannot fit the model's context window fails with one line naming the window
(and the request's size), and is not sent again: a local server may only break its stream
off at such a request, and four tries of it said nothing of why. A provider's own "context
length exceeded" is not retried either, and its counts are named when it gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from loopback import LoopbackProvider, Reply, text_reply
from provider_support import one_turn, provider_service

from maple_acp.runtime import RunNotice, RunState

#: What llama.cpp's Python server sends when the prompt overflows its context after its
#: headers went out: a 200 event stream, no event, the connection closed.
BROKEN_AT_ONCE = Reply(events=[], done=False, break_off=True)
#: About 2,500 tokens by any estimate.
LONG_PROMPT = "word " * 2_000


async def failed_turn(
    tmp_path: Path, provider: LoopbackProvider, project: Path, prompt: str, **options: Any
) -> str:
    async with provider_service(tmp_path, provider, backoff=(0.0,), **options) as service:
        with trio.fail_after(20):
            events, outcome = await one_turn(service, project, prompt)
    assert outcome.state is RunState.FAILED
    assert outcome.failure is not None
    assert [e.text for e in events if isinstance(e, RunNotice) and e.terminal] == [outcome.failure]
    assert "\n" not in outcome.failure
    return outcome.failure


async def test_a_prompt_past_the_configured_window_names_it_and_is_sent_once(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(*[BROKEN_AT_ONCE] * 4)
    failure = await failed_turn(tmp_path, provider, project, LONG_PROMPT, context_window=512)
    assert failure.startswith("the request (~")
    assert failure.endswith(" tokens) does not fit the model's context window of 512 tokens")
    estimated = int(failure.split("(~", 1)[1].split(" ", 1)[0].replace(",", ""))
    assert 2_000 <= estimated <= 3_000
    assert "retr" not in failure
    assert len(provider.chat_requests()) == 1


async def test_a_broken_stream_of_a_request_that_fits_is_still_retried(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(BROKEN_AT_ONCE, text_reply("hello"))
    async with provider_service(
        tmp_path, provider, backoff=(0.0,), context_window=100_000
    ) as service:
        with trio.fail_after(20):
            _, outcome = await one_turn(service, project, LONG_PROMPT)
    assert outcome.state is RunState.COMPLETED
    assert len(provider.chat_requests()) == 2


def error_body(**error: object) -> Reply:
    return Reply(status=400, body={"error": error})


@pytest.mark.parametrize(
    ("reply", "window", "expected"),
    [
        (
            # llama.cpp's server counts both sizes; its counts win over the configured window.
            error_body(
                code=400,
                message="the request exceeds the available context size, try increasing it",
                type="exceed_context_size_error",
                n_prompt_tokens=5_000,
                n_ctx=4_096,
            ),
            8_192,
            "the request (~5,000 tokens) does not fit the model's context window of "
            "4,096 tokens (HTTP 400)",
        ),
        (
            error_body(
                message="too long", type="invalid_request_error", code="context_length_exceeded"
            ),
            8_192,
            "the request does not fit the model's context window of 8,192 tokens (HTTP 400)",
        ),
        (
            # No code: the message says it (read, never shown).
            error_body(
                message="This model's maximum context length is 4096 tokens. However, you "
                "requested 9000 tokens",
                type="BadRequestError",
            ),
            None,
            "the request does not fit the model's context window (HTTP 400)",
        ),
        (
            # A server error that says so is not retried either.
            Reply(status=500, body={"error": {"code": "context_length_exceeded"}}),
            None,
            "the request does not fit the model's context window (HTTP 500)",
        ),
    ],
    ids=["llama-cpp-counts", "openai-code", "message-only", "server-error"],
)
async def test_a_provider_saying_the_request_is_too_long_is_not_retried(
    tmp_path: Path,
    provider: LoopbackProvider,
    project: Path,
    reply: Reply,
    window: int | None,
    expected: str,
) -> None:
    provider.add(*[reply] * 4)
    failure = await failed_turn(tmp_path, provider, project, "hi", context_window=window)
    assert failure == expected
    assert "maximum context length is" not in failure
    assert len(provider.chat_requests()) == 1
