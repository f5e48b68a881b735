"""Provider faults end a turn with one safe line (never the key, never the provider's text);
rate limits, server errors and lost connections are retried within bounds; a cancel closes the
HTTP stream at once and no tool runs after it. Real loopback server, real SDK, real runtime."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import pytest
import trio
import trio.testing
from loopback import LoopbackProvider, Reply, chunk, error_reply, text_reply, tool_call_reply
from provider_support import TEST_KEY, one_turn, open_lease, provider_service

from maple_acp.backends.provider import RequestTimeouts
from maple_acp.runtime import (
    AgentService,
    PermissionRequest,
    RunNotice,
    RunOutcome,
    RunState,
    TextChunk,
    ToolRow,
)
from maple_acp.testing.demo import run_prompt


async def failure_of(service: AgentService, project: Path, prompt: str = "hi") -> str:
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        events, outcome = await run_prompt(lease, prompt)
        history = await lease.history()
        await lease.release(close=False)
    assert outcome.state is RunState.FAILED
    assert outcome.failure is not None
    notices = [e.text for e in events if isinstance(e, RunNotice) and e.terminal]
    assert notices == [outcome.failure]
    # The user's message was admitted before the failure: nothing is lost.
    assert history[0].text == prompt
    assert TEST_KEY not in outcome.failure
    assert "\n" not in outcome.failure
    return outcome.failure


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_credentials_fail_with_one_line_and_are_not_retried(
    service: AgentService, provider: LoopbackProvider, project: Path, status: int
) -> None:
    # Real providers quote part of the key in this message; it must never be shown.
    provider.add(
        error_reply(status, f"Incorrect API key provided: {TEST_KEY[:8]}***{TEST_KEY[-4:]}")
    )
    failure = await failure_of(service, project)
    assert failure == f"the provider refused the credentials (HTTP {status})"
    assert len(provider.chat_requests()) == 1


@pytest.mark.parametrize(
    ("status", "provider_text", "expected"),
    [
        (
            404,
            "The model `test-model` does not exist",
            "the provider does not know the model 'test-model' (HTTP 404)",
        ),
        (
            400,
            "you sent something odd: <echo of the whole prompt>",
            "the provider rejected the request (HTTP 400)",
        ),
    ],
    ids=["unknown-model", "bad-request"],
)
async def test_a_refused_request_has_its_own_line_without_the_provider_text(
    service: AgentService,
    provider: LoopbackProvider,
    project: Path,
    status: int,
    provider_text: str,
    expected: str,
) -> None:
    provider.add(error_reply(status, provider_text))
    failure = await failure_of(service, project)
    assert failure == expected


async def test_a_rate_limit_is_retried_after_retry_after_then_succeeds(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(error_reply(429, "slow down", retry_after="0"), text_reply("finally"))
    events, outcome = await one_turn(service, project, "hi")
    assert outcome.state is RunState.COMPLETED
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "finally"
    assert len(provider.chat_requests()) == 2


async def test_server_errors_are_retried_three_times_then_one_line(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(*(error_reply(503, "busy", retry_after_ms="1") for _ in range(5)))
    failure = await failure_of(service, project)
    assert failure == "the provider failed to answer (HTTP 503); gave up after 3 retries"
    assert len(provider.chat_requests()) == 4


async def test_a_retry_after_beyond_the_bound_gives_up_at_once(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(error_reply(429, "later", retry_after="3600"))
    with trio.fail_after(10):
        failure = await failure_of(service, project)
    assert failure.startswith("the provider is limiting the rate of requests (HTTP 429)")
    assert "not retried" in failure
    assert len(provider.chat_requests()) == 1


async def test_an_unreachable_provider_is_one_line_naming_only_its_address(
    tmp_path: Path, project: Path
) -> None:
    # A port nobody listens on: bind, note it, close.
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    dead = LoopbackProvider()
    dead.port = port
    # No waits between the attempts (the waits themselves are tested in virtual time).
    async with provider_service(tmp_path, dead, backoff=(0.0,)) as service:
        failure = await failure_of(service, project)
    assert failure == (
        f"could not reach the provider at http://127.0.0.1:{port}; gave up after 3 retries"
    )


async def test_a_malformed_first_line_is_not_retried_forever(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(Reply(events=["[1, 2"]))
    failure = await failure_of(service, project)
    assert failure == "the provider sent a malformed stream"
    assert len(provider.chat_requests()) == 1


async def test_a_stream_that_breaks_off_after_text_fails_without_repeating_it(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(Reply(events=[chunk(content="half an ans")], break_off=True), text_reply("again"))
    failure = await failure_of(service, project)
    assert failure == "the provider's stream broke off before the answer ended"
    assert len(provider.chat_requests()) == 1


async def test_a_stalled_stream_ends_at_the_read_timeout(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(Reply(events=[chunk(content="and then")], stall=True))
    timeouts = RequestTimeouts(read=0.2)
    async with provider_service(tmp_path, provider, timeouts=timeouts) as service:
        with trio.fail_after(20):
            failure = await failure_of(service, project)
    assert failure == "the provider's stream broke off before the answer ended"


async def cancelled_once_streaming(
    service: AgentService, provider: LoopbackProvider, project: Path, *, after_text: bool
) -> RunOutcome:
    """Cancel a run once the provider streams (and, with ``after_text``, once its first text
    arrived); the provider must see its connection closed within a second."""
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("go")
        if after_text:
            async for event in run.events():
                if isinstance(event, TextChunk):
                    break
        await provider.streaming.wait()
        closed = provider.closed_event
        run.cancel()
        with trio.fail_after(1):
            await closed.wait()
        outcome = await run.wait()
        await lease.release(close=False)
    return outcome


async def test_cancel_mid_stream_closes_the_connection_at_once(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(Reply(events=[chunk(content="streaming...")], stall=True))
    outcome = await cancelled_once_streaming(service, provider, project, after_text=True)
    assert outcome.state is RunState.CANCELLED


async def test_cancel_while_a_tool_waits_for_permission_runs_no_tool(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(
        tool_call_reply(
            ("a", "shell", {"command": "touch first.txt"}),
            ("b", "shell", {"command": "touch second.txt"}),
        ),
        text_reply("never asked"),
    )
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("go")
        rows: list[ToolRow] = []
        async for event in run.events():
            if isinstance(event, ToolRow):
                rows.append(event)
            if isinstance(event, PermissionRequest):
                run.cancel()
                # A late allow after the cancel is refused, never honoured.
                assert not event.responder.answer("allow_once")
        outcome = await run.wait()
        await lease.release(close=False)
    assert outcome.state is RunState.CANCELLED
    assert not (project / "first.txt").exists()
    assert not (project / "second.txt").exists()
    assert len(provider.chat_requests()) == 1
    assert rows[-1].tool.status.value == "cancelled"


async def test_retries_are_cancellation_aware(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(error_reply(429, "wait", retry_after="25"))
    async with trio.open_nursery() as nursery:
        lease = await open_lease(service, project, nursery)
        run = await lease.start_run("go")
        await provider.requested.wait()
        await trio.testing.wait_all_tasks_blocked()
        run.cancel()
        with trio.fail_after(2):
            outcome = await run.wait()
        await lease.release(close=False)
    assert outcome.state is RunState.CANCELLED
    assert len(provider.chat_requests()) == 1


@pytest.mark.parametrize(
    "events",
    [
        # A line that is not JSON after some text.
        [chunk(content="partial "), "{this is not json"],
        [{"choices": [{"delta": {"content": 42}}]}],
        ["[1, 2]"],
        ['"just a string"'],
        [{"choices": "nope"}],
        [{"choices": [{"delta": {"reasoning": ["not", "text"]}}]}],
        [{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": 5}]}}]}],
        [{"choices": [{"delta": {}, "finish_reason": 7}]}],
    ],
)
async def test_a_malformed_or_misshapen_stream_is_one_line(
    service: AgentService, provider: LoopbackProvider, project: Path, events: list[object]
) -> None:
    provider.add(Reply(events=events))
    failure = await failure_of(service, project)
    assert failure == "the provider sent a malformed stream"


async def test_an_untrusted_tls_certificate_is_one_line_and_not_retried(
    tmp_path: Path, project: Path
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    await trio.run_process(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        capture_stdout=True,
        capture_stderr=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = LoopbackProvider(tls=context)
    server.add(text_reply("never"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        async with provider_service(tmp_path, server) as service:
            failure = await failure_of(service, project)
        nursery.cancel_scope.cancel()
    assert failure == (
        f"the provider at https://127.0.0.1:{server.port} has a TLS certificate not trusted here"
    )
    assert not server.requests


async def test_cancel_before_the_answer_starts_closes_the_connection_too(
    service: AgentService, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(Reply(silent=True))
    outcome = await cancelled_once_streaming(service, provider, project, after_text=False)
    assert outcome.state is RunState.CANCELLED
