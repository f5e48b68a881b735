"""``session/update`` throughput: our host through the connector, against the official SDK.

Run: ``python bench/bench_throughput.py [--updates N] [--size B] [--runs R] [--sdk-python PY]``.
Prints plain text; the ratios measured in one run are what count (absolute figures move up to
2x between runs on the same machine). Both sides stay up for the whole run and their prompts
alternate (ours, then the SDK's, R times), so that a slow moment of the machine hits both.

Ours: ``maple-acp serve`` (a subprocess) -> owner-only Unix socket -> ``maple-acp-connector``
(a subprocess) -> its stdout pipe -> this script, which reads every line. The prompt is
``/stream N B`` for the demo backend: N agent-message chunks of B bytes.

Baseline: an agent written with the official Python ACP SDK (``agent-client-protocol`` on PyPI,
import name ``acp``) answering the same prompt with the same N chunks over plain stdio, read by
the same client code. The SDK is needed only here: the ``bench`` nox session installs it, or
``pip install agent-client-protocol`` into any venv and pass its interpreter with
``--sdk-python`` (or set ``ACP_SDK_PYTHON``). Without it the baseline is skipped (exit 0).

Targets (issue 13): ours >= 6x the SDK baseline's updates per second, the connector hop
included, and the host + connector CPU per update at most 1/8 of the SDK agent's. Both sides
are timed from the prompt request to its answer; the client does the same work per line for
both (look for ``session/update``, parse only the other lines). CPU is read from
``/proc/PID/stat`` (user + system time) of the agent processes before and after each prompt.
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
import threading
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


#: What precedes a text chunk's text on the wire, with or without a space after the colon.
_TEXT_KEY = b'"text":'


class LineClient:
    """A minimal blocking ACP client over a child's stdin/stdout (the same for both sides)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._next_id = 0
        #: How many agent-message updates the last :meth:`answer` read (each one line).
        self.chunks = 0

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
        """Send a request; return its result and how many characters of agent-message text
        came first."""
        return self.answer(self.send(method, params), method)

    def answer(self, request_id: int, method: str = "the request") -> tuple[Any, int]:
        """Read up to the answer of ``request_id``; count agent-message text on the way, in
        characters (the load's text is plain ``x``: no escapes). Characters, not chunks: an
        agent may join chunks queued together into one, as ours does."""
        chars = chunks = 0
        readline = self._stdout.readline
        while True:
            line = readline()
            if not line:
                raise RuntimeError(f"the agent closed its stdout during {method}")
            if b'"session/update"' in line:
                # Other updates (our model lock on the first prompt) are not the load.
                if b'"agent_message_chunk"' in line:
                    chunks += 1
                    # The text's opening quote, then its closing one.
                    start = line.find(b'"', line.find(_TEXT_KEY) + len(_TEXT_KEY)) + 1
                    chars += line.find(b'"', start) - start
                continue
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                self.chunks = chunks
                return message["result"], chars

    def until_idle(self) -> tuple[int, str]:
        """(v2) Read up to the turn's ``idle`` state update; count chunks on the way."""
        updates = 0
        readline = self._stdout.readline
        while True:
            line = readline()
            if not line:
                raise RuntimeError("the agent closed its stdout during a turn")
            updates += b'"agent_message_chunk"' in line
            if b'"state_update"' in line and b'"idle"' in line:
                return updates, json.loads(line)["params"]["update"]["stopReason"]


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes ``pids`` have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            # The command name may hold spaces; the fields after its closing paren do not.
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total * _TICK_S


class Side:
    """One agent under test: a client to it and the processes whose CPU it costs."""

    def __init__(self, client: LineClient, pids: list[int], cwd: str, protocol: int = 1) -> None:
        self.client = client
        self.pids = pids
        self.protocol = protocol
        init = {"protocolVersion": protocol, "clientCapabilities": {}}
        if protocol == 2:
            init = {"protocolVersion": 2, "info": {"name": "bench", "version": "0"}}
        answer = client.call("initialize", init)[0]
        if answer["protocolVersion"] != protocol:
            raise RuntimeError(f"asked for protocol {protocol}, got {answer['protocolVersion']}")
        self.session = client.call("session/new", {"cwd": cwd, "mcpServers": []})[0]["sessionId"]
        self.rates: list[float] = []
        self.cpu_per_update: list[float] = []

    def prompt(self, updates: int, size: int) -> None:
        prompt = [{"type": "text", "text": f"/stream {updates} {size}"}]
        cpu = cpu_seconds(self.pids)
        started = time.perf_counter()
        result, seen = self.client.call(
            "session/prompt", {"sessionId": self.session, "prompt": prompt}
        )
        if self.protocol == 2:
            # Answered on acceptance: the turn ends with its idle state update.
            more, reason = self.client.until_idle()
            seen += more
            result = {"stopReason": reason}
        elapsed = time.perf_counter() - started
        used = cpu_seconds(self.pids) - cpu
        if seen != updates * size or result.get("stopReason") != "end_turn":
            raise RuntimeError(
                f"expected {updates * size} characters and end_turn, got {seen}: {result}"
            )
        self.rates.append(updates / elapsed)
        self.cpu_per_update.append(used / updates)


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


@contextlib.contextmanager
def ours_side(scratch: Path, protocol: int = 1) -> Iterator[Side]:
    """Our host and a connector to it, as one side speaking ``protocol``."""
    project = scratch / "project"
    project.mkdir(exist_ok=True)
    with running_host(scratch) as (host, socket_path):
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
            yield Side(client, [host.pid, connector.pid], str(project), protocol)
            connector.stdin.close()
            connector.wait(timeout=TIMEOUT_S)
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


@contextlib.contextmanager
def sdk_side(python: str, scratch: Path) -> Iterator[Side]:
    """The official SDK's agent over stdio, as one side."""
    agent_file = scratch / "sdk_agent.py"
    agent_file.write_text(SDK_AGENT)
    agent = subprocess.Popen(
        [python, str(agent_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert agent.stdin is not None
        assert agent.stdout is not None
        yield Side(LineClient(agent.stdin, agent.stdout), [agent.pid], str(scratch))
        agent.stdin.close()
        agent.wait(timeout=TIMEOUT_S)
    finally:
        if agent.poll() is None:
            agent.kill()


def fairness(scratch: Path, streams: int, updates: int, size: int) -> list[float]:
    """Updates/s of each of ``streams`` connections streaming at once through one host."""
    project = scratch / "fair-project"
    project.mkdir(exist_ok=True)
    with running_host(scratch / "fair") as (host, socket_path), contextlib.ExitStack() as stack:
        sides: list[Side] = []
        for _ in range(streams):
            connector = subprocess.Popen(
                [PYTHON, "-m", "maple_acp_connector", "--socket", str(socket_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=_clean_env(),
            )
            stack.callback(connector.kill)
            assert connector.stdin is not None
            assert connector.stdout is not None
            client = LineClient(connector.stdin, connector.stdout)
            sides.append(Side(client, [host.pid, connector.pid], str(project)))
        start = threading.Barrier(streams)
        rates: list[float] = [0.0] * streams

        def run(index: int) -> None:
            side = sides[index]
            start.wait()
            side.prompt(updates, size)
            rates[index] = side.rates[-1]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return rates


def side_by_side(updates: int, size: int, runs: int) -> int:
    """Our host over v2 and over v1, alternating prompts; CPU per update of each."""
    scratch = Path(tempfile.mkdtemp(prefix="macp-bench-"))
    try:
        (scratch / "v1").mkdir()
        (scratch / "v2").mkdir()
        with ours_side(scratch / "v1", 1) as v1, ours_side(scratch / "v2", 2) as v2:
            for _ in range(runs):
                v1.prompt(updates, size)
                v2.prompt(updates, size)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"ACP v2 beside v1, /stream {updates} {size}, {runs} alternating runs each")
    for side in (v1, v2):
        print(
            f"  v{side.protocol}: {statistics.median(side.rates):>10,.0f} updates/s, "
            f"host + connector CPU per update {statistics.median(side.cpu_per_update) * 1e6:.2f} us"
            f"  (runs: {_runs(side.cpu_per_update, 1e6, '.2f')})"
        )
    ratio = statistics.median(v2.cpu_per_update) / statistics.median(v1.cpu_per_update)
    print(
        f"  CPU per update v2 / v1: {ratio:.3f} ({'meets' if ratio <= 1.10 else 'MISSES'} <= 1.10)"
    )
    return 0


def _runs(values: list[float], scale: float, fmt: str) -> str:
    return ", ".join(format(v * scale, fmt) for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # CPU time is read in clock ticks (10 ms): over 100,000 updates a tick is 0.1 us of the
    # ~2 us per update, where over 20,000 it was 0.5 us and a median flipped between 2 and 3.
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5, help="prompts per side (median counts)")
    parser.add_argument("--sdk-python", help="an interpreter that has agent-client-protocol")
    parser.add_argument(
        "--fairness",
        type=int,
        default=0,
        metavar="K",
        help="instead: K connections streaming at once, each one's rate against the mean",
    )
    parser.add_argument(
        "--protocol",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: our host over ACP v2 beside the same over v1, instead of the SDK baseline",
    )
    args = parser.parse_args()
    if args.protocol == 2:
        return side_by_side(args.updates, args.size, args.runs)

    scratch = Path(tempfile.mkdtemp(prefix="macp-bench-"))
    if args.fairness:
        try:
            rates = fairness(scratch, args.fairness, args.updates, args.size)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        mean = statistics.mean(rates)
        spread = max(abs(r / mean - 1) for r in rates)
        print(f"fairness: {args.fairness} connections streaming /stream {args.updates} {args.size}")
        print(f"  per connection: {', '.join(f'{r:,.0f}' for r in rates)} updates/s")
        verdict = "meets" if spread <= 0.10 else "MISSES"
        print(f"  largest deviation from the mean: {spread:.1%} ({verdict} +-10%)")
        return 0
    sdk_python = _sdk_python(args.sdk_python)
    try:
        with contextlib.ExitStack() as stack:
            ours = stack.enter_context(ours_side(scratch))
            sdk = stack.enter_context(sdk_side(sdk_python, scratch)) if sdk_python else None
            for _ in range(args.runs):
                ours.prompt(args.updates, args.size)
                if sdk is not None:
                    sdk.prompt(args.updates, args.size)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"session/update throughput and CPU, /stream {args.updates} {args.size}, "
        f"{args.runs} alternating runs each"
    )
    rate = statistics.median(ours.rates)
    cpu = statistics.median(ours.cpu_per_update)
    print(
        f"  maple-acp host -> socket -> connector -> client: {rate:>10,.0f} updates/s"
        f"  (runs: {_runs(ours.rates, 1, ',.0f')})"
    )
    print(
        f"    host + connector CPU per update: {cpu * 1e6:6.2f} us"
        f"  (runs: {_runs(ours.cpu_per_update, 1e6, '.2f')})"
    )
    if sdk is None:
        print(
            "  SDK baseline skipped: agent-client-protocol is not installed here. Install it"
            " with 'pip install agent-client-protocol' (the nox bench session does) or pass"
            " --sdk-python PATH."
        )
        return 0
    sdk_rate = statistics.median(sdk.rates)
    sdk_cpu = statistics.median(sdk.cpu_per_update)
    print(
        f"  official ACP SDK agent over stdio:               {sdk_rate:>10,.0f} updates/s"
        f"  (runs: {_runs(sdk.rates, 1, ',.0f')})"
    )
    print(
        f"    agent CPU per update: {sdk_cpu * 1e6:6.2f} us"
        f"  (runs: {_runs(sdk.cpu_per_update, 1e6, '.2f')})"
    )
    ratio = rate / sdk_rate
    cpu_ratio = sdk_cpu / cpu if cpu else float("inf")
    print(f"  throughput ours / SDK: {ratio:.2f}x ({'meets' if ratio >= 6 else 'MISSES'} 6x)")
    print(
        f"  CPU per update SDK / ours: {cpu_ratio:.2f}x "
        f"({'meets' if cpu_ratio >= 8 else 'MISSES'} 8x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
