"""``maple-acp demo``: a throwaway host in this process and a scripted session through real
connector subprocesses, narrated as it happens (``->`` client to agent, ``<-`` back).

The narrating client is :class:`~maple_acp.cli._client.LineClient`, a blocking client of the
command line's own; it runs in a worker thread beside the host's Trio loop, so the host keeps
serving while the client waits.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from maple_acp.cli._client import LineClient, NotServed, initialize, list_sessions
from maple_acp.cli._host import HostOptions, open_default_host
from maple_acp.config import make_private_dir

#: The demo gives its whole scripted session this long before calling it stuck.
DEMO_DEADLINE_S: Final = 60.0


def _short(text: str, limit: int = 72) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Transcript:
    """Writes the demo's conversation as it happens: ``->`` client to agent, ``<-`` back."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._seen = 0

    def say(self, line: str) -> None:
        self._write(line)

    def updates(self, client: LineClient, label: str = "") -> None:
        """Print every ``session/update`` that arrived since the last call."""
        for params in client.updates[self._seen :]:
            self._write(f"   <- {label}{describe_update(params.get('update', {}))}")
        self._seen = len(client.updates)

    def restart(self) -> None:
        self._seen = 0


def describe_update(update: Mapping[str, Any]) -> str:
    kind = str(update.get("sessionUpdate"))
    if kind in ("agent_message_chunk", "user_message_chunk", "agent_thought_chunk"):
        content = update.get("content", {})
        text = content.get("text", "") if isinstance(content, dict) else ""
        name = {"agent_message_chunk": "agent", "user_message_chunk": "user"}.get(kind, "thought")
        return f"{name}: {_short(text)!s}"
    if kind in ("tool_call", "tool_call_update"):
        parts = [kind, str(update.get("status", ""))]
        if update.get("title"):
            parts.append(repr(update["title"]))
        for item in update.get("content") or []:
            inner = item.get("content", {}) if isinstance(item, dict) else {}
            if isinstance(inner, dict) and inner.get("text"):
                parts.append(f"output {_short(inner['text'], 40)!r}")
        return " ".join(part for part in parts if part)
    if kind == "config_option_update":
        return "config_option_update (the model is now locked for this session)"
    if kind == "session_info_update":
        return f"session info: title {update.get('title')!r}"
    if kind == "available_commands_update":
        names = [f"/{c.get('name')}" for c in update.get("availableCommands") or []]
        return f"available commands: {_short(' '.join(names), 60)}"
    if kind == "plan":
        return f"plan: {len(update.get('entries') or [])} entries"
    if kind == "usage_update":
        return f"context usage: {update.get('used')} of {update.get('size')} tokens"
    return kind


DEMO_STREAM_PROMPT: Final = (
    "/think The demo backend reads this prompt as a script.\n"
    "Hello from the maple-acp demo backend.\n"
    "/stream 4 6\n"
    "/usage 12 34"
)
DEMO_TOOL_PROMPT: Final = '/tool shell {"command": "echo hi"}'
DEMO_HANG_PROMPT: Final = "/echo working on it…\n/hang"


def _text_prompt(session_id: str, text: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}


@contextmanager
def _connector_client(
    name: str,
    endpoint: Path,
    connector: Sequence[str],
    transcript: Transcript,
    on_request: Callable[[str, Any], Any],
) -> Iterator[LineClient]:
    """A real connector subprocess bridged to ``endpoint``, and a client on its stdio."""
    import subprocess

    process = subprocess.Popen(
        [*connector, "--socket", os.fspath(endpoint)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    stdin = process.stdin

    def write(data: bytes) -> None:
        stdin.write(data)
        stdin.flush()

    transcript.say(f"== {name}: connector pid {process.pid} ({' '.join(connector[1:])})")
    try:
        yield LineClient(
            process.stdout.fileno(),
            write,
            idle_timeout=DEMO_DEADLINE_S,
            peer="the connector",
            on_request=on_request,
        )
    finally:
        stdin.close()  # end of input: the host answers what it read, then closes
        process.stdout.close()
        status = process.wait(timeout=DEMO_DEADLINE_S)
        transcript.say(f"== {name}: connector exited with status {status}")


def run_demo(
    endpoint: Path, project: Path, transcript: Transcript, *, connector: Sequence[str]
) -> None:
    """Drive one scripted session through real connector subprocesses and narrate it
    (blocking: ``demo`` runs it in a worker thread beside the host's Trio loop)."""

    def on_request(method: str, params: Any) -> Any:
        if method != "session/request_permission" or not isinstance(params, dict):
            raise NotServed
        options = params.get("options", [])
        names = ", ".join(str(o.get("optionId")) for o in options)
        transcript.say(
            f"   <- session/request_permission {params['toolCall'].get('title')!r} "
            f"options [{names}]"
        )
        allow = next(o for o in options if o.get("kind") == "allow_once")
        transcript.say(f"   -> answer {allow['optionId']}")
        return {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}}

    cwd = os.fspath(project)
    with _connector_client("connection 1", endpoint, connector, transcript, on_request) as client:
        transcript.say("-> initialize (protocolVersion 1)")
        init = initialize(client)
        info = init.get("agentInfo", {})
        caps = init.get("agentCapabilities", {})
        transcript.say(
            f"   <- {info.get('name')} {info.get('version')}, "
            f"protocol {init.get('protocolVersion')}, loadSession={caps.get('loadSession')}"
        )
        transcript.say(f"-> session/new cwd={project}")
        new = client.request("session/new", {"cwd": cwd, "mcpServers": []})
        session_id = new["sessionId"]
        models = [o for o in new.get("configOptions", []) if o.get("id") == "model"]
        model = models[0].get("currentValue") if models else None
        transcript.say(f"   <- sessionId {session_id}, model {model}")

        for prompt in (DEMO_STREAM_PROMPT, DEMO_TOOL_PROMPT):
            transcript.say(f"-> session/prompt {_short(prompt)!r}")
            answer = client.request(
                "session/prompt",
                _text_prompt(session_id, prompt),
                on_update=lambda _: transcript.updates(client),
            )
            transcript.updates(client)
            usage = answer.get("usage")
            suffix = (
                f", usage {usage.get('inputTokens')}/{usage.get('outputTokens')}" if usage else ""
            )
            transcript.say(f"   <- stopReason {answer['stopReason']}{suffix}")

        transcript.say(f"-> session/prompt {_short(DEMO_HANG_PROMPT)!r}")
        cancelled = False

        def cancel_once(params: Mapping[str, Any]) -> None:
            # The first update shows the run is under way; then the client cancels it.
            nonlocal cancelled
            transcript.updates(client)
            if not cancelled:
                cancelled = True
                transcript.say("-> session/cancel")
                client.notify("session/cancel", {"sessionId": session_id})

        answer = client.request(
            "session/prompt", _text_prompt(session_id, DEMO_HANG_PROMPT), on_update=cancel_once
        )
        transcript.updates(client)
        transcript.say(f"   <- stopReason {answer.get('stopReason')}")

        transcript.say("-> session/close")
        client.request("session/close", {"sessionId": session_id})
        transcript.say("   <- closed (the session stays in history)")

    transcript.restart()
    with _connector_client("connection 2", endpoint, connector, transcript, on_request) as client:
        transcript.say("-> initialize")
        initialize(client)
        transcript.say(f"-> session/list cwd={project}")
        for item in list_sessions(client, cwd):
            title = f" {item['title']!r}" if item.get("title") else ""
            transcript.say(f"   <- {item.get('sessionId')}{title} updated {item.get('updatedAt')}")
        transcript.say(f"-> session/load {session_id} (history is replayed before the answer)")
        client.request("session/load", {"sessionId": session_id, "cwd": cwd, "mcpServers": []})
        transcript.updates(client, "replay ")
        transcript.say("   <- loaded")
        transcript.say("-> session/close")
        client.request("session/close", {"sessionId": session_id})
        transcript.say("   <- closed")


async def demo_main(connector: Sequence[str], write: Callable[[str], None]) -> None:
    import trio

    with tempfile.TemporaryDirectory(prefix="maple-acp-demo-") as scratch:
        root = Path(scratch)
        (root / "project").mkdir()
        options = HostOptions(
            endpoint=make_private_dir(root / "run", "socket directory") / "acp.sock",
            data_dir=make_private_dir(root / "data", "data directory"),
            account="demo",
        )
        transcript = Transcript(write)
        with trio.fail_after(DEMO_DEADLINE_S):
            async with open_default_host(options):
                transcript.say(f"maple-acp demo: service listening on {options.endpoint}")
                # `click.echo` from the worker thread: the host's loop stays free to serve.
                await trio.to_thread.run_sync(
                    lambda: run_demo(
                        options.endpoint, root / "project", transcript, connector=connector
                    ),
                    abandon_on_cancel=True,
                )
        transcript.say("maple-acp demo: service stopped; done")
