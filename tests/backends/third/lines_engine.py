"""A third engine in one module, built only on the provider layer's public foundation
(``maple_acp.backends.provider``): it proves that a new kind of provider needs its own wire
format and nothing else. Its made-up API: ``POST {base_url}/lines`` with the messages and
the tools as JSON, answered by one JSON object per line: ``{"text": ...}``, ``{"call": {"id",
"name", "arguments"}}``, and a last ``{"done": "stop" | "tool"}``.

The foundation gives it the target of a turn, the system prompt, the tools and their
permission rules, retries within the fault rules, the transcript of what it sent (later turns
carry the same bytes), and the turn's end."""

from __future__ import annotations

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
from maple_acp.model import ItemKind
from maple_acp.runtime import StopReason, Turn, TurnResult

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


class LinesEngine(ProviderEngine):
    # The configuration's kinds are the layer's registry; this test engine borrows one.
    kind = OPENAI_KIND
    _clients: LinesClients

    def open_clients(self) -> LinesClients:
        return LinesClients(self._timeouts)

    async def run_turn(self, turn: Turn) -> TurnResult:
        entry, model = self.target(turn)
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
        mark = len(messages)
        answer = Answer()
        for _ in range(self._max_requests):
            for item in turn.steering():
                messages.append({"role": "user", "content": item.text})
            stream = partial(self._stream, turn, entry, model, list(messages))
            answer = await self.retried(turn, entry, Answer, stream)
            if not answer.calls:
                break
            calls = [attrs.asdict(call) for call in answer.calls]
            messages.append({"role": "assistant", "content": answer.text, "calls": calls})
            for call, told in await self.run_tools(turn, answer.calls):
                messages.append({"role": "tool", "id": call.call_id, "content": told})
        final = [{"role": "assistant", "content": answer.text}] if answer.text else []
        await self.keep(turn, FORMAT, [*messages[mark:], *final])
        return self.ended(turn, answer.text, StopReason.END_TURN)

    async def _stream(
        self,
        turn: Turn,
        entry: ProviderEntry,
        model: str,
        messages: list[dict[str, Any]],
        answer: Answer,
    ) -> None:
        body = {"model": model, "messages": messages, "tools": offered_tools(turn)}
        client = self._clients.get(entry)
        try:
            async with client.stream("POST", f"{entry.base_url}/lines", json=body) as response:
                if response.status_code >= 400:
                    raise status_fault(response.status_code, response.headers, None, model)
                await closing(response, self._read(turn, response, answer))
        except httpx2.TransportError:
            raise connection_fault(where(entry), timed_out=False) from None
        if not answer.done:
            raise ProviderFault(BROKEN_STREAM, retryable=True)

    @staticmethod
    async def _read(turn: Turn, response: httpx2.Response, answer: Answer) -> None:
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
