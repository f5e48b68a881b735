"""A third engine in one module, built only on the provider layer's public foundation
(``maple_acp.backends.provider``): it proves that a new kind of provider needs its own wire
format and nothing else. Its made-up API: ``POST {base_url}/lines`` with the messages and
the tools as JSON, answered by one JSON object per line: ``{"text": ...}``, ``{"call": {"id",
"name", "arguments"}}``, and a last ``{"done": "stop" | "tool"}``.

It gives the foundation a turn's exchange (its messages, its request, the reading of its
stream); the foundation gives it the target of a turn, the system prompt, the rounds, the
tools and their permission rules, retries within the fault rules, the transcript of what it
sent (later turns carry the same bytes), and the turn's end."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any

import attrs
import httpx2
import orjson

from maple_acp.backends.provider import (
    BROKEN_STREAM,
    MALFORMED_STREAM,
    OPENAI_KIND,
    ProviderEngine,
    ProviderEntry,
    ProviderFault,
    RequestTimeouts,
    ToolCall,
    after_compaction,
    closing,
    connection_fault,
    http_client,
    kept_transcripts,
    offered_tools,
    runs_of,
    status_fault,
    tool_outcome,
    where,
)
from maple_acp.model import ItemKind, TimelineItem
from maple_acp.runtime import StopReason, Turn

FORMAT = "lines"


@attrs.define
class Answer:
    text: str = ""
    calls: list[ToolCall] = attrs.field(factory=list)
    done: bool = False
    started: bool = False
    forwarded: bool = False
    message_id: str | None = None


class LinesClients:
    """One HTTP client per provider, closed with the engine."""

    def __init__(self, timeouts: RequestTimeouts) -> None:
        self._timeouts = timeouts
        self._clients: dict[str, httpx2.AsyncClient] = {}

    def get(self, entry: ProviderEntry) -> httpx2.AsyncClient:
        if entry.name not in self._clients:
            self._clients[entry.name] = http_client(entry, self._timeouts, None)
        return self._clients[entry.name]

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


@attrs.define
class LinesExchange:
    """One turn's conversation: plain message dicts, sent as they are."""

    turn: Turn
    client: httpx2.AsyncClient
    entry: ProviderEntry
    model: str
    messages: list[dict[str, Any]]
    mark: int

    def fresh(self) -> Answer:
        return Answer()

    def steer(self, items: Sequence[TimelineItem]) -> None:
        for item in items:
            self.messages.append({"role": "user", "content": item.text})

    async def request(self) -> Callable[[Answer], Coroutine[Any, Any, None]]:
        return partial(self.stream, list(self.messages))

    async def outcome(self, answer: Answer, number: int) -> StopReason | list[ToolCall]:
        return answer.calls or StopReason.END_TURN

    def add(self, answer: Answer, told: Sequence[tuple[ToolCall, str]]) -> None:
        calls = [attrs.asdict(call) for call in answer.calls]
        self.messages.append({"role": "assistant", "content": answer.text, "calls": calls})
        for call, result in told:
            self.messages.append({"role": "tool", "id": call.call_id, "content": result})

    def text(self, answer: Answer) -> str:
        return answer.text

    def transcript(self, answer: Answer) -> list[dict[str, Any]]:
        final = [{"role": "assistant", "content": answer.text}] if answer.text else []
        return [*self.messages[self.mark :], *final]

    async def stream(self, messages: list[dict[str, Any]], answer: Answer) -> None:
        body = {"model": self.model, "messages": messages, "tools": offered_tools(self.turn)}
        url = f"{self.entry.base_url}/lines"
        try:
            async with self.client.stream("POST", url, json=body) as response:
                if response.status_code >= 400:
                    raise status_fault(response.status_code, response.headers, None, self.model)
                await closing(response, read(self.turn, response, answer))
        except httpx2.TransportError:
            raise connection_fault(where(self.entry), timed_out=False) from None
        if not answer.done:
            raise ProviderFault(BROKEN_STREAM, retryable=True)


async def read(turn: Turn, response: httpx2.Response, answer: Answer) -> None:
    async for line in response.aiter_lines():
        answer.started = True
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
            if "text" in event:
                answer.text += event["text"]
                answer.forwarded = True
                answer.message_id = await turn.send_text(
                    event["text"], message_id=answer.message_id
                )
            elif "call" in event:
                answer.calls.append(ToolCall(**event["call"]))
            elif "done" in event:
                answer.done = True
        except (orjson.JSONDecodeError, TypeError, KeyError):
            raise ProviderFault(MALFORMED_STREAM) from None


class LinesEngine(ProviderEngine):
    # The configuration's kinds are the layer's registry; this test engine borrows one.
    kind = OPENAI_KIND
    transcript_format = FORMAT
    _clients: LinesClients

    def open_clients(self) -> LinesClients:
        return LinesClients(self._timeouts)

    async def exchange(self, turn: Turn, entry: ProviderEntry, model: str) -> LinesExchange:
        _, history = after_compaction(turn.history)
        transcripts = await kept_transcripts(turn, history, FORMAT)
        system = self.system_prompt(turn, turn.history, transcripts)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for run_id, rows in runs_of(history):
            if rows[0].kind is ItemKind.USER:
                messages.append({"role": "user", "content": rows.pop(0).text})
            sent = transcripts.get(run_id) if run_id is not None else None
            if sent is not None:
                messages.extend(sent)
                continue
            for row in rows:
                if row.kind in (ItemKind.USER, ItemKind.ASSISTANT):
                    messages.append({"role": row.kind.value, "content": row.text})
                elif row.kind is ItemKind.TOOL and row.tool is not None:
                    messages.append({"role": "tool", "content": tool_outcome(row.tool)})
        messages.append({"role": "user", "content": self.prompt_text(turn)})
        return LinesExchange(turn, self._clients.get(entry), entry, model, messages, len(messages))
