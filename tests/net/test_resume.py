"""Nothing lost on a blip: a session's SSE stream dropped in the middle of a streamed answer
and opened again with ``Last-Event-ID`` delivers exactly what was sent — no gap, no duplicate;
an id older than what the stream keeps, or a stream gone past the resume window, is ``410``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import trio
from net_support import DEADLINE, INITIALIZE, NetHost, SseReader, net_host, rpc

JSON = {"Content-Type": "application/json"}
SSE = {"Accept": "text/event-stream"}
#: The demo's /stream load: CHUNKS chunks of SIZE bytes of "x", one message.
CHUNKS, SIZE = 400, 100


class HttpSession:
    """A Streamable HTTP connection driven by hand (the official clients do not send
    ``Last-Event-ID`` yet): the connection stream, one session, its stream."""

    def __init__(self, host: NetHost, client: httpx2.AsyncClient) -> None:
        self.host = host
        self.client = client
        self.connection: dict[str, str] = {}
        self.session_id = ""

    def headers(self, **extra: str) -> dict[str, str]:
        return self.host.headers(**self.connection, **extra)

    async def post(self, body: bytes, **extra: str) -> None:
        answer = await self.client.post(
            self.host.url, content=body, headers=self.headers(**JSON, **extra)
        )
        assert answer.status_code == 202, answer.status_code

    def session_stream(self, last_event_id: int | None = None) -> Any:
        extra = {"Acp-Session-Id": self.session_id}
        if last_event_id is not None:
            extra["Last-Event-ID"] = str(last_event_id)
        return self.client.stream("GET", self.host.url, headers=self.headers(**SSE, **extra))


async def open_session(session: HttpSession, project: Path, main: SseReader) -> None:
    await session.post(rpc("session/new", {"cwd": str(project), "mcpServers": []}, 1))
    _, created = await main.until(lambda m: m.get("id") == 1)
    session.session_id = created["result"]["sessionId"]


def chunk_text(message: Any) -> str:
    if message.get("method") != "session/update":
        return ""
    update = message["params"]["update"]
    if update.get("sessionUpdate") != "agent_message_chunk":
        return ""
    return str(update["content"]["text"])


def is_prompt_answer(message: Any) -> bool:
    return message.get("id") == 2


async def test_a_dropped_session_stream_resumes_with_exactly_what_was_missed(
    project: Path,
) -> None:
    async with net_host() as host, host.client() as client:
        session = HttpSession(host, client)
        opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        session.connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        with trio.fail_after(DEADLINE):
            async with client.stream("GET", host.url, headers=session.headers(**SSE)) as conn:
                main = SseReader(conn)
                await open_session(session, project, main)
                seen: list[tuple[int | None, Any]] = []
                async with session.session_stream() as first:
                    assert first.status_code == 200
                    stream = SseReader(first)
                    await session.post(
                        rpc(
                            "session/prompt",
                            {
                                "sessionId": session.session_id,
                                "prompt": [{"type": "text", "text": f"/stream {CHUNKS} {SIZE}"}],
                            },
                            2,
                        ),
                        **{"Acp-Session-Id": session.session_id},
                    )
                    # Read until some of the answer's text has come, then drop the stream.
                    await stream.until(lambda m: bool(chunk_text(m)), seen)
                before = "".join(chunk_text(m) for _, m in seen)
                assert 0 < len(before) < CHUNKS * SIZE, "the drop was not in the middle"
                assert not any(is_prompt_answer(m) for _, m in seen)
                last_id = seen[-1][0]
                assert last_id is not None
                async with session.session_stream(last_id) as again:
                    assert again.status_code == 200
                    resumed = SseReader(again)
                    await resumed.until(is_prompt_answer, seen)
        ids = [event_id for event_id, _ in seen]
        # Every event once, in order, with no hole.
        assert ids == list(range(ids[0], ids[0] + len(ids)))
        text = "".join(chunk_text(m) for _, m in seen)
        assert text == "x" * (CHUNKS * SIZE)
        assert seen[-1][1]["result"]["stopReason"] == "end_turn"


async def test_an_id_the_stream_no_longer_keeps_is_410(project: Path) -> None:
    # A window of 4 events: after a longer answer, the first events are gone.
    async with net_host(keep_lines=4) as host, host.client() as client:
        session = HttpSession(host, client)
        opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        session.connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        with trio.fail_after(DEADLINE):
            async with client.stream("GET", host.url, headers=session.headers(**SSE)) as conn:
                main = SseReader(conn)
                await open_session(session, project, main)
                seen: list[tuple[int | None, Any]] = []
                async with session.session_stream() as first:
                    stream = SseReader(first)
                    for index in range(3):
                        await session.post(
                            rpc(
                                "session/prompt",
                                {
                                    "sessionId": session.session_id,
                                    "prompt": [{"type": "text", "text": f"/echo {index}"}],
                                },
                                10 + index,
                            ),
                            **{"Acp-Session-Id": session.session_id},
                        )
                        await stream.until(lambda m, i=index: m.get("id") == 10 + i, seen)
                first_id = seen[0][0]
                assert first_id is not None
                assert len(seen) > 4
                async with session.session_stream(first_id) as gone:
                    assert gone.status_code == 410
                # The newest ids are still kept; one past what was sent is not an id at all.
                async with session.session_stream(seen[-2][0]) as kept:
                    assert kept.status_code == 200
                    _, replayed = await SseReader(kept).next()
                    assert replayed == seen[-1][1]
                async with session.session_stream(seen[-1][0] + 5) as future:
                    assert future.status_code == 410
