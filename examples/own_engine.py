"""A complete host that brings its own engine: ACP clients talk to a lookup table.

The engine (``LookupEngine``) is an ``AgentBackend`` with no model behind it:

- a question it has in ``ANSWERS`` gets that answer (with a short thought first);
- ``/note TEXT`` appends a line to ``NOTES.md`` in the session's project directory through a
  tool of its own: the tool row shows the diff and the file, the client is asked first, and a
  refusal leaves the file alone;
- ``/again`` repeats the previous answer, read from the conversation so far (``turn.history``);
- it declares ``/note`` and ``/again`` as available commands, which clients offer as slash
  commands.

Run (the directories are created private, 0700)::

    .venv/bin/python examples/own_engine.py --socket /tmp/own/acp.sock --data-dir /tmp/own/data

then point an ACP client at ``maple-acp acp --socket /tmp/own/acp.sock``. SIGINT or SIGTERM
stops it: the ACP service first, then the runtime, then the store. ``docs/backends.md``
describes everything a ``Turn`` offers.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import signal
import sys
from pathlib import Path

import trio

from maple_acp.config import PrivateDirectoryError, make_private_dir
from maple_acp.edge import AcpService, AcpServiceConfig, HostLifecycle, ListenerError
from maple_acp.listeners import UnixListener
from maple_acp.runtime import (
    AgentService,
    AskForTools,
    CommandInfo,
    FileDiff,
    FileToolError,
    ItemKind,
    ModelInfo,
    StaticModelCatalog,
    ToolLocation,
    ToolRequest,
    ToolState,
    ToolStatus,
    Turn,
    write_text_async,
)
from maple_acp.store import SqliteTaskStore

ANSWERS = {
    "what is acp": "The Agent Client Protocol: JSON-RPC between an editor and a coding agent.",
    "what is trio": "A Python library for structured concurrency.",
    "who are you": "A lookup table that speaks ACP.",
}
NOTES_FILE = "NOTES.md"
#: The engine's one tool; the host's policy asks the client before it runs.
NOTE_TOOL = "note"


class LookupEngine:
    """The host's engine: answers from ``ANSWERS``, keeps notes, repeats itself."""

    def available_commands(self) -> tuple[CommandInfo, ...]:
        return (
            CommandInfo(name="note", description="Append TEXT to NOTES.md", input_hint="TEXT"),
            CommandInfo(name="again", description="Repeat the previous answer"),
        )

    async def run_turn(self, turn: Turn) -> None:
        prompt = turn.prompt.strip()
        command, _, argument = prompt.partition(" ")
        if command == "/note":
            await self.note(turn, argument.strip())
        elif prompt == "/again":
            answers = [item.text for item in turn.history if item.kind is ItemKind.ASSISTANT]
            await turn.send_text(answers[-1] if answers else "I have not answered anything yet.")
        else:
            key = prompt.lower().rstrip("?!. ")
            answer = ANSWERS.get(key)
            if answer is None:
                known = "; ".join(f"{question}?" for question in ANSWERS)
                await turn.send_text(f"I only know: {known}")
            else:
                await turn.send_thought(f"found {key!r} in the table")
                await turn.send_text(answer)

    async def note(self, turn: Turn, text: str) -> None:
        if not text:
            await turn.send_text("Usage: /note TEXT")
            return
        try:
            # The shared file tools open every component from the project's directory (no
            # symlink, no swapped directory leads out of it); a dry run reads the current text.
            preview = await write_text_async(turn.root, NOTES_FILE, "", dry_run=True)
        except FileToolError as exc:
            await turn.send_text(f"I cannot keep notes here: {exc}")
            return
        path, old = preview.path, preview.old_text
        new = (old or "") + f"- {text}\n"
        tool_id = f"{turn.run_id}-note"
        title = f"Append to {NOTES_FILE}"

        def row(status: ToolStatus, output: str | None = None) -> ToolState:
            return ToolState(
                name=NOTE_TOOL,
                status=status,
                title=title,
                raw_input={"text": text},
                output_text=output,
                diffs=(FileDiff(path=path, old_text=old, new_text=new),),
                locations=(ToolLocation(path=path),),
            )

        await turn.send_tool_row(tool_id, row(ToolStatus.PENDING))
        request = ToolRequest(
            tool_id=tool_id, name=NOTE_TOOL, title=title, raw_input={"text": text}
        )
        if not await turn.ask_permission(request):
            await turn.send_tool_row(tool_id, row(ToolStatus.FAILED, "permission denied"))
            await turn.send_text(f"{NOTES_FILE} is unchanged.")
            return
        try:
            await write_text_async(turn.root, NOTES_FILE, new)
        except FileToolError as exc:
            await turn.send_tool_row(tool_id, row(ToolStatus.FAILED, str(exc)))
            return
        await turn.send_tool_row(tool_id, row(ToolStatus.COMPLETED, "noted"))
        await turn.send_text(f"Noted in {NOTES_FILE}.")


async def serve(socket_path: Path, data_dir: Path) -> None:
    """Store, runtime and ACP service, until SIGINT or SIGTERM."""
    store = await SqliteTaskStore.open(data_dir / "tasks.sqlite3")
    async with store:
        runtime = AgentService(
            store=store,
            backend=LookupEngine(),
            catalog=StaticModelCatalog((ModelInfo(id="lookup", name="Lookup table"),)),
            policy=AskForTools(frozenset({NOTE_TOOL})),
        )
        async with runtime:
            runtime.sign_in(getpass.getuser())
            acp = AcpService(runtime, AcpServiceConfig())
            lifecycle = HostLifecycle(runtime, acp)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    await acp.start(nursery, UnixListener(socket_path))
                    print(f"own engine: serving on {socket_path}", file=sys.stderr, flush=True)
                    async for _ in signals:
                        break
                    await lifecycle.shutdown()
                    nursery.cancel_scope.cancel()
    print("own engine: stopped", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="an ACP host whose engine is a lookup table")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--data-dir", required=True, type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    socket_path = args.socket.absolute()
    try:
        # The socket and the conversations are private: each directory made here is 0700,
        # and an existing one that is not private is refused with the fix.
        make_private_dir(socket_path.parent, "socket directory")
        data_dir = make_private_dir(args.data_dir, "data directory")
    except PrivateDirectoryError as exc:
        print(f"own engine: {exc}", file=sys.stderr)
        return 1
    refused: BaseException | None = None
    try:
        trio.run(serve, socket_path, data_dir)
    except* ListenerError as group:  # the socket path is unusable: say why in one line
        refused = group
    while isinstance(refused, BaseExceptionGroup):  # nurseries wrap it, maybe twice
        refused = refused.exceptions[0]
    if refused is not None:
        print(f"own engine: {refused}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
