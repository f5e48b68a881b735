"""The answer read as bytes: SSE events split anywhere come out whole, the text an ACP client
receives is byte for byte the text the model streamed (with chunks joined on the way), one
HTTP client per provider serves every turn and closes at stop, and building the backend
imports no SDK. Real loopback server, real SDK request path, real runtime and edge."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from loopback import LoopbackProvider, Reply, chunk, text_reply
from provider_support import TEST_KEY, one_turn, provider_service

from maple_acp.backends import build_backend, provider_config_from_flags, provider_policy
from maple_acp.backends.openai._stream import SseEvents
from maple_acp.backends.provider import STREAM_ERROR
from maple_acp.backends.provider._faults import MALFORMED_STREAM, ProviderFault
from maple_acp.runtime import RunState, TextChunk
from maple_acp.testing.schema import AcpSchema
from maple_acp.testing.service import running_demo_acp

# -- SSE framing (sans-I/O) ---------------------------------------------------------------------

#: Events as providers send them: each one or more ``data:`` lines of text without breaks.
_events = st.lists(
    st.lists(
        st.text(
            st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), min_size=1
        ).map(str.encode),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=8,
)


@given(
    events=_events,
    newline=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    extras=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
)
def test_events_split_anywhere_come_out_whole(
    events: list[list[bytes]], newline: bytes, extras: bool, cuts: list[int]
) -> None:
    stream = b""
    for lines in events:
        if extras:
            # A comment and fields a chat stream carries no meaning in.
            stream += b": keep-alive" + newline + b"event: chunk" + newline + b"id: 7" + newline
        stream += b"".join(b"data: " + line + newline for line in lines) + newline
    # An unfinished event at the end is not an event.
    stream += b"data: unfinished"
    decoder = SseEvents()
    seen: list[bytes] = []
    start = 0
    for cut in [*sorted({min(cut, len(stream)) for cut in cuts}), len(stream)]:
        seen += decoder.feed(stream[start:cut])
        start = cut
    assert seen == [b"\n".join(lines) for lines in events]


def test_data_lines_of_one_event_are_joined_and_the_space_is_optional() -> None:
    decoder = SseEvents()
    assert decoder.feed(b'data:{"a":\ndata: 1}\n\ndata:x\n\n') == [b'{"a":\n1}', b"x"]


def test_an_endless_line_is_a_malformed_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    from maple_acp.backends.openai import _stream

    monkeypatch.setattr(_stream, "MAX_EVENT_BYTES", 100)
    decoder = SseEvents()
    decoder.feed(b"data: " + b"x" * 90)
    with pytest.raises(ProviderFault) as caught:
        decoder.feed(b"x" * 20)
    assert caught.value.line == MALFORMED_STREAM
    with pytest.raises(ProviderFault):
        SseEvents().feed(b"data: " + b"x" * 60 + b"\ndata: " + b"y" * 60 + b"\n")


# -- through the runtime and the edge -----------------------------------------------------------


#: One delta: ("content" or "reasoning_content", its text).
_deltas = st.lists(
    st.tuples(
        st.sampled_from(["content", "content", "reasoning_content"]),
        st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
    ),
    min_size=1,
    max_size=60,
)


async def _client_texts(
    directory: Path, deltas: list[tuple[str, str]], one_write: bool, schema: AcpSchema
) -> tuple[str, str]:
    provider = LoopbackProvider()
    events: list[Any] = [
        chunk(content=text) if kind == "content" else chunk(reasoning_content=text)
        for kind, text in deltas
    ]
    events.append(chunk(finish_reason="stop"))
    provider.add(Reply(events=events, one_write=one_write))
    project = directory / "project"
    project.mkdir()
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.serve)
        config = provider_config_from_flags(
            provider.base_url, "test-model", api_key_env="TEST_PROVIDER_KEY"
        )
        backend, catalog = build_backend(config, {"TEST_PROVIDER_KEY": TEST_KEY})
        async with (
            backend,
            running_demo_acp(
                directory, backend=backend, catalog=catalog, policy=provider_policy()
            ) as harness,
            harness.connect() as client,
        ):
            await client.initialize()
            sid = (await client.new_session(str(project)))["sessionId"]
            answer = await client.prompt(sid, "go")
            assert answer["stopReason"] == "end_turn"
            assert client.validate(schema) > 2
            texts = client.text(sid), client.text(sid, "agent_thought_chunk")
        nursery.cancel_scope.cancel()
    return texts


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(deltas=_deltas, one_write=st.booleans())
def test_the_client_receives_exactly_the_streamed_text(
    deltas: list[tuple[str, str]], one_write: bool, acp_schema: AcpSchema
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        text, thought = trio.run(_client_texts, Path(directory), deltas, one_write, acp_schema)
    assert text == "".join(piece for kind, piece in deltas if kind == "content")
    assert thought == "".join(piece for kind, piece in deltas if kind != "content")


async def test_deltas_read_together_reach_the_caller_as_one_chunk(
    service: Any, provider: LoopbackProvider, project: Path
) -> None:
    pieces = [f"token{n} " for n in range(200)]
    reply = text_reply(*pieces)
    reply.one_write = True
    provider.add(reply)
    events, outcome = await one_turn(service, project, "go")
    assert outcome.state is RunState.COMPLETED
    chunks = [event.text for event in events if isinstance(event, TextChunk)]
    assert "".join(chunks) == "".join(pieces)
    assert len(chunks) < len(pieces)


async def test_an_error_inside_the_stream_is_its_own_line(
    service: Any, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(Reply(events=[{"error": {"message": f"bad key {TEST_KEY}"}}]))
    _events, outcome = await one_turn(service, project, "go")
    assert outcome.state is RunState.FAILED
    assert outcome.failure == STREAM_ERROR


# -- one client per provider ----------------------------------------------------------------------


async def test_one_connection_serves_every_turn_and_closes_at_stop(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(text_reply("one"), text_reply("two"), text_reply("three"))
    async with provider_service(tmp_path, provider) as service:
        for _ in range(3):
            _events, outcome = await one_turn(service, project, "go")
            assert outcome.state is RunState.COMPLETED
        # Kept alive between turns: one connection for three requests, still open.
        assert len(provider.chat_requests()) == 3
        assert provider.connections == 1
        assert provider.closed == 0
        closed = provider.closed_event
    with trio.fail_after(5):
        await closed.wait()
    assert provider.closed == 1


async def test_warm_up_makes_the_client_before_the_first_turn_without_a_request(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    config = provider_config_from_flags(provider.base_url, "test-model")
    backend, _ = build_backend(config, {})
    async with backend:
        await backend.warm_up()
        assert backend._clients.open_clients == 1
        # The rehearsal request stays in memory: nothing reached any server.
        assert provider.requests == []
    assert backend._clients.open_clients == 0


def test_building_the_backend_imports_no_sdk() -> None:
    check = (
        "import sys\n"
        "from maple_acp.backends import build_backend, provider_config_from_flags\n"
        "build_backend(provider_config_from_flags('http://127.0.0.1:9/v1', 'm'), {})\n"
        "loaded = [m for m in ('openai', 'httpx2') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, capture_output=True, timeout=60)
