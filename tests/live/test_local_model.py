"""A real model in the loop: an ACP client -> ``maple-acp acp`` (a subprocess) -> ``maple-acp
serve`` (a subprocess, its provider configured in ``config.toml``) -> a recording proxy ->
llama.cpp's Python server running SmolLM2-135M-Instruct on one thread.

The checks are about structure and timing, never about the model's words: a streamed answer,
the history of turn one in turn two, a cancel the server sees, the ``max_tokens`` stop, a
prompt past the context window, a tool call allowed end to end and the turn after it, the
byte-identical history prefix of every later request, ``doctor`` and ``status``.

The server calls a tool only when the request forces it (``tool_choice`` naming the
function) and the engine never sends ``tool_choice``, nor ``max_tokens`` but in a
compaction's summary request, so the proxy adds them to one request where a check needs
them; its record keeps the body the host sent.
The model's end-of-answer tokens are banned the same way where a check needs a long answer.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final

import httpx2 as httpx
import orjson
import pytest
import trio
from e2e.host_processes import (
    MAPLE_ACP,
    Connector,
    Host,
    assert_only_protocol_lines,
    connector_client,
    home_env,
    private_short_dir,
    run_command,
    running_host,
)

from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema

from .conftest import FIGURES
from .local_server import CONTEXT_TOKENS, MODEL, LocalServer
from .recording_proxy import Exchange, RecordingProxy

#: Bounds one test; a turn of this model on one thread takes a few seconds.
DEADLINE: Final = 180.0
#: The suite's real-time bound, past the test's own (the first test also starts the server).
pytestmark = pytest.mark.deadline(DEADLINE + 120)
PROVIDER: Final = "local"
#: SmolLM2's end tokens (``<|endoftext|>``, ``<|im_end|>``): banned where a check needs an
#: answer that goes on until ``max_tokens``.
NO_END: Final = {"logit_bias": {"0": -100, "2": -100}}
#: What the host may add to a first answer chunk over the server's own latency.
MAX_ADDED_FIRST_CHUNK_S: Final = 1.0


@pytest.fixture
def short_dir() -> Any:
    with private_short_dir("macp-l-") as path:
        yield path


def _env(short_dir: Path) -> dict[str, str]:
    return home_env(short_dir, XDG_CONFIG_HOME=os.fspath(short_dir / "cfg"))


@asynccontextmanager
async def live_host(short_dir: Path, proxy: RecordingProxy) -> AsyncIterator[Host]:
    """``maple-acp serve`` with one provider, the proxy, in ``config.toml``; its models are
    discovered from the server's ``GET /models``."""
    config = short_dir / "cfg" / "maple-acp" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'default_model = "{PROVIDER}/{MODEL}"\n'
        f'[[providers]]\nname = "{PROVIDER}"\nbase_url = "{proxy.base_url}"\n'
    )
    async with running_host(short_dir, "--log-level", "debug", env=_env(short_dir)) as host:
        yield host


@asynccontextmanager
async def acp(host: Host, **options: Any) -> AsyncIterator[Connector]:
    """``maple-acp acp`` bridged to ``host``, initialized."""
    async with connector_client(host.socket, command=[*MAPLE_ACP, "acp"], **options) as bridge:
        await bridge.client.initialize()
        yield bridge


class Turn:
    """One prompt with the moment each answer chunk arrived (``trio.current_time()``)."""

    def __init__(self, answer: Any, sent: float, chunks: list[tuple[float, dict[str, Any]]]):
        self.answer = answer
        self.sent = sent
        self.chunks = chunks

    @property
    def text_chunks(self) -> list[tuple[float, dict[str, Any]]]:
        return [(t, u) for t, u in self.chunks if not _is_notice(u)]

    @property
    def notices(self) -> list[dict[str, Any]]:
        return [u for _, u in self.chunks if _is_notice(u)]

    @property
    def text(self) -> str:
        return "".join(u["content"]["text"] for _, u in self.text_chunks)

    @property
    def first_chunk_s(self) -> float:
        return self.text_chunks[0][0] - self.sent


def _is_notice(update: dict[str, Any]) -> bool:
    return str(update.get("messageId", "")).endswith("-notice")


async def timed_prompt(client: AcpTestClient, sid: str, text: str) -> Turn:
    """Prompt and wait for the answer, noting when each ``agent_message_chunk`` arrived."""
    start = len(client.updates(sid))
    chunks: list[tuple[float, dict[str, Any]]] = []

    def arrived() -> list[dict[str, Any]]:
        return [
            u
            for u in client.updates(sid)[start:]
            if u.get("sessionUpdate") == "agent_message_chunk"
        ]

    async def watch() -> None:
        while True:
            await client.wait_until(lambda: len(arrived()) > len(chunks))
            now = trio.current_time()
            chunks.extend((now, update) for update in arrived()[len(chunks) :])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        sent = trio.current_time()
        answer = await client.prompt(sid, text)
        nursery.cancel_scope.cancel()
    chunks.extend((trio.current_time(), update) for update in arrived()[len(chunks) :])
    return Turn(answer, sent, chunks)


def messages_span(body: bytes) -> bytes:
    """The bytes of the request's ``messages`` array, as sent."""
    key = body.index(b'"messages":')
    start = body.index(b"[", key)
    _, end = json.JSONDecoder().raw_decode(body.decode(), start)
    return body[start:end]


def assert_prefix_kept(earlier: Exchange, later: Exchange) -> None:
    """``later`` sends every message of ``earlier`` byte for byte, then more."""
    before, after = messages_span(earlier.body), messages_span(later.body)
    assert after.startswith(before[:-1] + b","), (
        f"the history changed after byte {_first_difference(before, after)}:\n"
        f"before: {before[:-1][-400:]!r}\nafter:  {after[: len(before) + 200][-600:]!r}"
    )


def _first_difference(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


def assert_answered(exchange: Exchange) -> None:
    """The server answered this chat request whole: 200, streamed to its end with a finish
    reason (its body is shown otherwise)."""
    assert exchange.status == 200, (exchange.status, bytes(exchange.answer[:500]))
    assert exchange.ended, bytes(exchange.answer[-500:])
    assert exchange.finish_reasons(), bytes(exchange.answer[-500:])


async def test_a_streamed_answer_then_turn_two_sees_turn_one(
    short_dir: Path, proxy: RecordingProxy, acp_schema: AcpSchema
) -> None:
    project = short_dir / "project"
    project.mkdir()
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp(host) as bridge:
            client = bridge.client
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            first = await timed_prompt(client, sid, "Say hello in one short sentence.")
            second = await timed_prompt(client, sid, "Now say it once more, in French.")
            client.validate(acp_schema)
            assert_only_protocol_lines(client)
    for turn in (first, second):
        assert turn.answer["stopReason"] == "end_turn", turn.answer
        assert not turn.notices, turn.notices
        assert turn.text.strip()
    # Streamed: the answer came in pieces, over time, not as one block at the end.
    assert len(first.text_chunks) >= 2
    assert first.text_chunks[-1][0] > first.text_chunks[0][0]
    chats = proxy.chats()
    assert len(chats) == 2
    for exchange in chats:
        assert_answered(exchange)
    # Turn two carries turn one whole: the same bytes, the answer the client saw, the prompt.
    assert_prefix_kept(chats[0], chats[1])
    history = chats[1].json()["messages"]
    assert [m["role"] for m in history[-3:]] == ["user", "assistant", "user"]
    assert history[-2]["content"] == first.text
    assert history[-1]["content"] == "Now say it once more, in French."
    # Usage: a count the server reported, or none; never zeros standing in for unknown.
    reported = [p["usage"] for p in chats[0].payloads() if p.get("usage")]
    FIGURES["server reports usage in the stream"] = bool(reported)
    if "usage" in first.answer and first.answer["usage"] is not None:
        assert reported, f"usage without a server count: {first.answer['usage']}"
        assert first.answer["usage"]["inputTokens"] == reported[-1]["prompt_tokens"]
        assert first.answer["usage"]["outputTokens"] == reported[-1]["completion_tokens"]


async def _wait_for_log(server: LocalServer, text: str, after: int) -> int:
    # The server's log is a file: read it again until the line is there.
    while True:
        found = server.log_text().find(text, after)
        if found >= 0:
            return found
        await trio.sleep(0.05)


async def test_a_cancel_mid_stream_reaches_the_server(
    short_dir: Path, proxy: RecordingProxy, llama_server: LocalServer
) -> None:
    project = short_dir / "project"
    project.mkdir()
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp(host) as bridge:
            client = bridge.client
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            log_mark = len(llama_server.log_text())
            # A long answer: no end token, up to 1000 tokens (half a minute and more).
            proxy.force_next(max_tokens=1000, **NO_END)
            answers: list[Any] = []
            async with trio.open_nursery() as nursery:

                async def prompt() -> None:
                    answers.append(await client.prompt(sid, "Count from one to a thousand."))

                nursery.start_soon(prompt)
                await client.wait_until(lambda: len(client.text(sid)) >= 20)
                exchange = proxy.chats()[-1]
                assert not exchange.ended
                cancelled_at = trio.current_time()
                await client.cancel(sid)
            answered_in = trio.current_time() - cancelled_at
            # The host hung up on the server's stream: the proxy saw it and closed its own
            # connection, and the server noticed.
            await proxy.wait_until(lambda: exchange.closed_at is not None)
            with trio.fail_after(10):
                await _wait_for_log(llama_server, "Disconnected from client", log_mark)
            server_saw_in = trio.current_time() - cancelled_at
            # The server is free again: the next turn is answered.
            after = await timed_prompt(client, sid, "Say hello.")
    assert answers[0]["stopReason"] == "cancelled"
    assert answered_in < 2.0
    assert exchange.cut_by_client
    assert not exchange.ended
    assert exchange.closed_at is not None
    assert exchange.closed_at - cancelled_at < 2.0
    assert len(exchange.content_times()) < 1000
    assert after.answer["stopReason"] == "end_turn"
    assert_answered(proxy.chats()[-1])
    FIGURES["cancel: answered, server saw the disconnect (s)"] = (
        f"{answered_in:.2f}, {server_saw_in:.2f}"
    )


async def test_an_answer_cut_at_max_tokens_stops_as_max_tokens(
    short_dir: Path, proxy: RecordingProxy
) -> None:
    project = short_dir / "project"
    project.mkdir()
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp(host) as bridge:
            client = bridge.client
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            proxy.force_next(max_tokens=8, **NO_END)
            cut = await timed_prompt(client, sid, "Tell me a long story.")
            after = await timed_prompt(client, sid, "Say hello.")
    assert proxy.chats()[0].finish_reasons() == ["length"]
    assert cut.answer["stopReason"] == "max_tokens"
    assert cut.text.strip()
    assert not cut.notices
    assert after.answer["stopReason"] == "end_turn"
    assert_prefix_kept(proxy.chats()[0], proxy.chats()[1])


async def test_a_prompt_past_the_context_window_fails_in_one_clear_line(
    short_dir: Path, proxy: RecordingProxy
) -> None:
    project = short_dir / "project"
    project.mkdir()
    long_prompt = "Read this: " + " ".join(["apple banana cherry"] * (CONTEXT_TOKENS // 2))
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp(host) as bridge:
            client = bridge.client
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            failed = await timed_prompt(client, sid, long_prompt)
            after = await timed_prompt(client, sid, "Say hello.")
            log = host.stderr.text
    exchange = proxy.chats()[0]
    FIGURES["past the context window, the server sent"] = (
        f"HTTP {exchange.status}, {bytes(exchange.answer[:300])!r}"
    )
    # Not silence: the turn ends with one visible line saying what went wrong.
    assert not failed.text_chunks, failed.text
    assert len(failed.notices) == 1, failed.chunks
    line = failed.notices[0]["content"]["text"]
    assert line.strip()
    assert "\n" not in line.strip()
    assert line.strip() in log
    # The next turn is not silence either: answered, or failed in one line.
    assert after.answer["stopReason"] == "end_turn"
    assert after.text.strip() or len(after.notices) == 1, after.chunks
    FIGURES["the turn after a prompt past the window"] = (
        "answered" if after.text.strip() else f"failed: {after.notices[0]['content']['text']}"
    )


async def test_a_tool_call_allowed_end_to_end_and_the_turn_after_it(
    short_dir: Path, proxy: RecordingProxy, acp_schema: AcpSchema
) -> None:
    project = short_dir / "project"
    project.mkdir()
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp(host) as bridge:
            client = bridge.client
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            proxy.force_next(tool_choice={"type": "function", "function": {"name": "write_file"}})
            turn = await timed_prompt(
                client, sid, "Write the word hello into a new file named note.txt."
            )
            next_turn = await timed_prompt(client, sid, "Thank you. What did you just do?")
            client.validate(acp_schema)
    chats = proxy.chats()
    assert len(chats) == 3, [(c.status, c.forced) for c in chats]
    call, follow_up, later = chats
    # The server called the tool (streamed), the user allowed it, the file was written.
    assert_answered(call)
    assert call.finish_reasons() == ["tool_calls"]
    assert len(client.permission_requests) == 1
    calls = [u for u in client.updates(sid) if u["sessionUpdate"] == "tool_call"]
    assert [u["kind"] for u in calls] == ["edit"]
    statuses = [
        u.get("status")
        for u in client.updates(sid)
        if u["sessionUpdate"] == "tool_call_update" and u["toolCallId"] == calls[0]["toolCallId"]
    ]
    assert statuses[-1] == "completed", statuses
    assert [p for p in project.rglob("*") if p.is_file()]
    # The follow-up request carries the call and its result, and the server takes it.
    roles = [m["role"] for m in follow_up.json()["messages"]]
    assert roles[-2:] == ["assistant", "tool"]
    assert_prefix_kept(call, follow_up)
    assert_answered(follow_up)
    assert turn.answer["stopReason"] == "end_turn"
    assert not turn.notices, turn.notices
    # The next turn sends the tool turn as it was sent in that turn, byte for byte.
    assert_prefix_kept(follow_up, later)
    assert_answered(later)
    assert next_turn.answer["stopReason"] == "end_turn"
    assert not next_turn.notices, next_turn.notices


async def test_doctor_and_status_see_the_local_server(
    short_dir: Path, proxy: RecordingProxy
) -> None:
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host:
            # The host checks its provider once it listens: status shows the outcome after.
            await host.stderr.wait_for(lambda line: f'provider "{PROVIDER}" at' in line)
            socket = os.fspath(host.socket)
            status = await trio.to_thread.run_sync(
                partial(
                    run_command, [*MAPLE_ACP, "status", "--socket", socket], env=_env(short_dir)
                )
            )
            as_json = await trio.to_thread.run_sync(
                partial(
                    run_command,
                    [*MAPLE_ACP, "status", "--socket", socket, "--json"],
                    env=_env(short_dir),
                )
            )
            checked_from = len(proxy.exchanges)
            doctor = await trio.to_thread.run_sync(
                partial(
                    run_command,
                    [*MAPLE_ACP, "doctor", "--socket", socket],
                    env=_env(short_dir),
                    timeout=60,
                )
            )
    assert status.returncode == 0, status.stderr
    assert as_json.returncode == 0, as_json.stderr
    engine = json.loads(as_json.stdout)["engine"]
    assert engine["backend"] == "provider"
    assert engine["defaultModel"] == f"{PROVIDER}/{MODEL}"
    [provider] = engine["providers"]
    assert provider["name"] == PROVIDER
    assert provider["state"] == "reachable", provider
    assert provider["models"] == 1
    provider_lines = [line for line in status.stdout.splitlines() if "provider:" in line]
    assert len(provider_lines) == 1
    assert f"{PROVIDER} at " in provider_lines[0]
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    checks = doctor.stdout.partition("\n\n")[0].splitlines()
    assert [line[:2] for line in checks] == ["✓ "] * len(checks), checks
    assert len([line for line in checks if line.startswith(f'✓ provider "{PROVIDER}"')]) == 1
    # The doctor asked the server itself (through the proxy), not a cached answer.
    asked = [e for e in proxy.exchanges[checked_from:] if e.path.endswith("/models")]
    assert asked
    assert asked[-1].status == 200


async def test_first_chunk_latency_and_rate_direct_and_through_the_host(
    short_dir: Path, proxy: RecordingProxy, llama_server: LocalServer
) -> None:
    """The same request, once from this test straight to the server and once through the
    host: the host adds little to the first chunk and keeps the server's pace."""
    project = short_dir / "project"
    project.mkdir()
    tokens = 64
    with trio.fail_after(DEADLINE):
        async with live_host(short_dir, proxy) as host, acp(host) as bridge:
            client = bridge.client
            # A first turn warms the server's cache of the common prefix (system, tools).
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            await timed_prompt(client, sid, "Say hello.")
            body = proxy.chats()[0].json()
            body["messages"][-1]["content"] = "Count from one to fifty, in words."
            direct = await _direct_stream(llama_server, {**body, "max_tokens": tokens, **NO_END})
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            proxy.force_next(max_tokens=tokens, **NO_END)
            hosted = await timed_prompt(client, sid, "Count from one to fifty, in numbers.")
    exchange = proxy.chats()[-1]
    assert_answered(exchange)
    served = exchange.content_times()
    assert len(served) >= tokens // 2
    assert len(direct) >= tokens // 2
    direct_first = direct[0]
    server_first = served[0] - exchange.arrived
    hosted_first = hosted.first_chunk_s
    direct_rate = (len(direct) - 1) / (direct[-1] - direct[0])
    hosted_rate = (len(served) - 1) / (hosted.text_chunks[-1][0] - hosted.text_chunks[0][0])
    FIGURES["first chunk (s): direct, server for the host's request, through the host"] = (
        f"{direct_first:.3f}, {server_first:.3f}, {hosted_first:.3f}"
    )
    FIGURES["tokens/s: direct, through the host"] = f"{direct_rate:.1f}, {hosted_rate:.1f}"
    assert hosted.answer["stopReason"] == "max_tokens"
    assert hosted_first - server_first < MAX_ADDED_FIRST_CHUNK_S
    assert hosted_rate > direct_rate / 2


async def _direct_stream(server: LocalServer, body: dict[str, Any]) -> list[float]:
    """Stream ``body`` straight to the server: when each event carrying answer text arrived,
    in seconds from the request."""
    times: list[float] = []
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(60.0)) as http:
        sent = trio.current_time()
        async with http.stream(
            "POST",
            f"{server.base_url}/chat/completions",
            content=orjson.dumps(body),
            headers={"content-type": "application/json"},
        ) as answer:
            assert answer.status_code == 200
            async for line in answer.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                for choice in orjson.loads(line[5:]).get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        times.append(trio.current_time() - sent)
                        break
    return times
