"""A third engine, one module on the public foundation only (``lines_engine.py``): a turn
through the real runtime answers, runs a tool call asked for (its permission asked by the
foundation's rules), survives a server error by the foundation's retry, and a later turn
carries the first one's messages byte for byte. Its module imports no private module."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import trio
from lines_engine import LinesEngine
from loopback import LoopbackProvider, Reply, error_reply

from maple_acp.backends import build_backend, load_provider_config, provider_policy
from maple_acp.backends.provider import ProviderKeys
from maple_acp.runtime import PermissionRequest, RunState, TextChunk, ToolRow
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.store import temp_store


def lines(*events: dict[str, Any]) -> Reply:
    body = b"".join(json.dumps(event).encode() + b"\n" for event in events)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
    return Reply(raw=head + f"content-length: {len(body)}\r\n\r\n".encode() + body)


def test_the_engine_module_imports_only_public_modules() -> None:
    tree = ast.parse((Path(__file__).parent / "lines_engine.py").read_text())
    imported = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    ]
    ours = [name for name in imported if name.startswith("maple_acp")]
    assert ours == ["maple_acp.backends.provider", "maple_acp.model", "maple_acp.runtime"]
    assert not [name for name in ours if any(part.startswith("_") for part in name.split("."))]


async def test_a_third_engine_runs_turns_on_the_foundation(
    lines_server: LoopbackProvider, project: Path, tmp_path: Path
) -> None:
    (project / "a.txt").write_text("alpha\n")
    call = {"call_id": "c1", "name": "read_file", "arguments": '{"path":  "a.txt"}'}
    lines_server.add(
        lines({"text": "Let me look."}, {"call": call}, {"done": "tool"}),
        error_reply(503, "busy"),
        lines({"text": "It says alpha."}, {"done": "stop"}),
        lines({"text": "Yes."}, {"done": "stop"}),
    )
    config = load_provider_config(
        {"providers": [{"name": "lab", "base_url": lines_server.base_url, "models": ["m"]}]},
        "test config",
    )
    _, catalog = build_backend(config, {})
    engine = LinesEngine(config, ProviderKeys({}), backoff=(0.0,))
    states = []
    rows = []
    text = []
    async with engine, temp_store(tmp_path) as store:
        service = make_demo_service(
            store, backend=engine, catalog=catalog, policy=provider_policy()
        )
        async with service, trio.open_nursery() as nursery:
            service.sign_in(DEMO_ACCOUNT)
            lease = await nursery.start(service.serve_new_task, str(project))
            with trio.fail_after(30):
                for prompt in ("what is in a.txt?", "sure?"):
                    run = await lease.start_run(prompt)
                    async for event in run.events():
                        if isinstance(event, PermissionRequest):
                            event.responder.answer("allow_once")
                        if isinstance(event, ToolRow):
                            rows.append(event.tool.status.value)
                        if isinstance(event, TextChunk):
                            text.append(event.text)
                    states.append((await run.wait()).state)
            await lease.release(close=False)
    assert states == [RunState.COMPLETED, RunState.COMPLETED]
    assert "".join(text) == "Let me look.It says alpha.Yes."
    assert rows[-1] == "completed"
    requests = [r for r in lines_server.requests if r.path.endswith("/lines")]
    assert len(requests) == 4
    # The later turn carries what the first one sent, message for message, bytes and all.
    first, later = requests[2].body["messages"], requests[3].body["messages"]
    assert later[: len(first)] == first
    assert later[3] == {"role": "tool", "id": "c1", "content": "alpha\n"}
    assert later[2]["calls"][0]["arguments"] == '{"path":  "a.txt"}'
