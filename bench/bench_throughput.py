"""``session/update`` throughput: our host through the connector, against the official SDK.

Run: ``python bench/bench_throughput.py [--updates N] [--size B] [--runs R] [--sdk-python PY]``.
Prints plain text; the ratio measured in one run is what counts (absolute figures move up to
2x between runs on the same machine).

Ours: ``maple-acp serve`` (a subprocess) -> owner-only Unix socket -> ``maple-acp-connector``
(a subprocess) -> its stdout pipe -> this script, which reads every line. The prompt is
``/stream N B`` for the demo backend: N agent-message chunks of B bytes.

Baseline: an agent written with the official Python ACP SDK (``agent-client-protocol`` on PyPI,
import name ``acp``) answering the same prompt with the same N chunks over plain stdio, read by
the same client code. The SDK is needed only here: the ``bench`` nox session installs it, or
``pip install agent-client-protocol`` into any venv and pass its interpreter with
``--sdk-python`` (or set ``ACP_SDK_PYTHON``). Without it the baseline is skipped (exit 0).

Target: ours >= 2x the SDK baseline's updates per second, the connector hop included.
Both sides are timed from the prompt request to its answer; the client does the same work per
line for both (look for ``session/update``, parse only the other lines).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

PYTHON = sys.executable
#: A bench that has not produced its answer by then is stuck, not slow.
TIMEOUT_S = 120.0

SDK_AGENT = r'''
import asyncio, sys
import acp
from acp import PROTOCOL_VERSION, run_agent, text_block, update_agent_message
from acp.schema import AgentCapabilities, Implementation


class StreamAgent:
    """Answers "/stream N SIZE" with N agent-message chunks of SIZE bytes."""

    def on_connect(self, conn):
        self._conn = conn

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None,
                         **kwargs):
        return acp.InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(),
            agent_info=Implementation(name="sdk-baseline", version="1"),
        )

    async def new_session(self, cwd, mcp_servers=None, **kwargs):
        return acp.NewSessionResponse(session_id="s1")

    async def prompt(self, session_id, prompt, **kwargs):
        words = prompt[0].text.split()
        count, size = int(words[1]), int(words[2])
        chunk = "x" * size
        for _ in range(count):
            await self._conn.session_update(session_id, update_agent_message(text_block(chunk)))
        return acp.PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id, **kwargs):
        pass


asyncio.run(run_agent(StreamAgent()))
'''


class LineClient:
    """A minimal blocking ACP client over a child's stdin/stdout (the same for both sides)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._next_id = 0

    def send(self, method: str, params: Any) -> int:
        """Send a request without waiting for its answer; return its id."""
        self._next_id += 1
        request = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        self._stdin.write(json.dumps(request).encode() + b"\n")
        self._stdin.flush()
        return self._next_id

    def notify(self, method: str, params: Any) -> None:
        self._stdin.write(
            json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode() + b"\n"
        )
        self._stdin.flush()

    def call(self, method: str, params: Any) -> tuple[Any, int]:
        """Send a request; return its result and how many agent-message chunks came first."""
        return self.answer(self.send(method, params), method)

    def answer(self, request_id: int, method: str = "the request") -> tuple[Any, int]:
        """Read up to the answer of ``request_id``; count agent-message chunks on the way."""
        updates = 0
        readline = self._stdout.readline
        while True:
            line = readline()
            if not line:
                raise RuntimeError(f"the agent closed its stdout during {method}")
            if b'"session/update"' in line:
                # Other updates (our model lock on the first prompt) are not the load.
                updates += b'"agent_message_chunk"' in line
                continue
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"], updates


def measure(client: LineClient, cwd: str, updates: int, size: int, runs: int) -> list[float]:
    client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    session = client.call("session/new", {"cwd": cwd, "mcpServers": []})[0]["sessionId"]
    rates = []
    for _ in range(runs):
        prompt = [{"type": "text", "text": f"/stream {updates} {size}"}]
        started = time.perf_counter()
        result, seen = client.call("session/prompt", {"sessionId": session, "prompt": prompt})
        elapsed = time.perf_counter() - started
        if seen != updates or result.get("stopReason") != "end_turn":
            raise RuntimeError(f"expected {updates} updates and end_turn, got {seen}: {result}")
        rates.append(updates / elapsed)
    return rates


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MAPLE_ACP_SOCKET", None)
    env.pop("MAPLE_ACP_RELAY_ENV", None)
    return env


@contextlib.contextmanager
def running_host(scratch: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``maple-acp serve`` on a fresh socket and data dir under ``scratch``, until SIGTERM."""
    socket_path = scratch / "run" / "acp.sock"
    host = subprocess.Popen(
        [
            *(PYTHON, "-m", "maple_acp._main", "serve", "--socket", str(socket_path)),
            *("--data-dir", str(scratch / "data"), "--log-level", "warning"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_clean_env(),
    )
    try:
        assert host.stderr is not None
        while True:
            line = host.stderr.readline()
            if not line:
                raise RuntimeError("maple-acp serve exited before it was ready")
            if line.startswith(b"maple-acp: serving on "):
                break
        yield host, socket_path
    finally:
        host.send_signal(signal.SIGTERM)
        host.wait(timeout=TIMEOUT_S)


def bench_ours(scratch: Path, updates: int, size: int, runs: int) -> list[float]:
    project = scratch / "project"
    project.mkdir(exist_ok=True)
    with running_host(scratch) as (_, socket_path):
        connector = subprocess.Popen(
            [PYTHON, "-m", "maple_acp_connector", "--socket", str(socket_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_clean_env(),
        )
        try:
            assert connector.stdin is not None
            assert connector.stdout is not None
            client = LineClient(connector.stdin, connector.stdout)
            rates = measure(client, str(project), updates, size, runs)
            connector.stdin.close()
            connector.wait(timeout=TIMEOUT_S)
            return rates
        finally:
            if connector.poll() is None:
                connector.kill()


def _sdk_python(explicit: str | None) -> str | None:
    candidates = [explicit, os.environ.get("ACP_SDK_PYTHON"), PYTHON]
    for candidate in candidates:
        if not candidate:
            continue
        probe = subprocess.run(
            [candidate, "-c", "import acp, acp.schema; acp.run_agent"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    return None


def bench_sdk(python: str, scratch: Path, updates: int, size: int, runs: int) -> list[float]:
    agent_file = scratch / "sdk_agent.py"
    agent_file.write_text(SDK_AGENT)
    agent = subprocess.Popen(
        [python, str(agent_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert agent.stdin is not None
        assert agent.stdout is not None
        rates = measure(LineClient(agent.stdin, agent.stdout), str(scratch), updates, size, runs)
        agent.stdin.close()
        agent.wait(timeout=TIMEOUT_S)
        return rates
    finally:
        if agent.poll() is None:
            agent.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3, help="prompts per side (median counts)")
    parser.add_argument("--sdk-python", help="an interpreter that has agent-client-protocol")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="macp-bench-"))
    try:
        ours = bench_ours(scratch, args.updates, args.size, args.runs)
        sdk_python = _sdk_python(args.sdk_python)
        sdk = (
            bench_sdk(sdk_python, scratch, args.updates, args.size, args.runs)
            if sdk_python
            else None
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"session/update throughput, /stream {args.updates} {args.size}, {args.runs} runs each")
    ours_median = statistics.median(ours)
    print(
        f"  maple-acp host -> socket -> connector -> client: {ours_median:>10,.0f} updates/s"
        f"  (runs: {', '.join(f'{r:,.0f}' for r in ours)})"
    )
    if sdk is None:
        print(
            "  SDK baseline skipped: agent-client-protocol is not installed here. Install it"
            " with 'pip install agent-client-protocol' (the nox bench session does) or pass"
            " --sdk-python PATH."
        )
        return 0
    sdk_median = statistics.median(sdk)
    print(
        f"  official ACP SDK agent over stdio:               {sdk_median:>10,.0f} updates/s"
        f"  (runs: {', '.join(f'{r:,.0f}' for r in sdk)})"
    )
    ratio = ours_median / sdk_median
    verdict = "meets" if ratio >= 2 else "MISSES"
    print(f"  ratio ours / SDK: {ratio:.2f}x ({verdict} the 2x target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
