"""The model's path at the token rate: CPU per streamed model token through the real connector,
against a floor, and the time from ``session/prompt`` to the request reaching the model.

Run: ``python bench/bench_provider.py [--kind openai|anthropic] [--tokens N] [--runs R]
[--latency-runs L]``. Prints plain text; the ratios measured in one run are what count
(absolute figures move up to 2x between runs on a shared machine).

A loopback OpenAI-compatible server (``tests/backends/openai/loopback.py``) runs in its own
process and answers every chat request with N one-token SSE events plus a usage event (or as
many tokens as a numeric prompt asks for), and prints when each request's first bytes arrived
(``time.monotonic_ns``: one clock for every process on the machine).

Ours: ``maple-acp serve --provider-url ...`` (a subprocess) -> owner-only Unix socket ->
``maple-acp-connector`` (a subprocess) -> this script, which reads every line without parsing
the updates. CPU is user + system time of the host and the connector (``/proc/PID/stat``)
around each prompt, each prompt in a fresh session.

Floor: this process reading the same stream from the same server (plain HTTP over a socket,
``http.client`` undoing the chunked framing) and ``orjson.loads`` of each event: what any
Python consumer of the stream pays before it does anything with a token. Runs alternate
between ours and the floor so that a slow moment of the machine hits both.

Latency: ``session/prompt`` sent -> the request's first bytes at the server, for a one-token
answer: warm (the same host after the CPU runs, a fresh session each time) and on a fresh
host's first prompt (a new host each time: ready, its CPU settled, a connector, ``initialize``
and ``session/new``, then the timed prompt). Medians.

The latency is wall time, so a busy machine inflates it; the host + connector CPU time of the
whole one-token prompt (``schedstat``, nanoseconds) is printed beside it: an upper bound on the
CPU spent before the request left, which a busy machine does not inflate.

Targets: host + connector CPU per token at most 1.2x the floor (the median of the ratios
of each pair of runs); <= 3 ms warm; <= 5 ms on a fresh host's first prompt. CPU per token is
read from ``schedstat`` (nanoseconds): a 2,000-token answer takes ~50 ms, on which the 10 ms
ticks of ``/proc/PID/stat`` would move the figure by ~5 us.

``--kind anthropic``: the same over Anthropic's Messages streaming format
(``tests/backends/anthropic/messages_loopback.py``, ``serve --provider-kind anthropic``). Its
floor is this process reading the same stream through the ``anthropic`` SDK's own stream (what
the backend reads): the target (issue 24) is host + connector within 20 % of that.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
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

import orjson

HERE = Path(__file__).resolve().parent
SERVER = HERE.parent / "tests" / "backends" / "openai" / "loopback.py"
MESSAGES_SERVER = HERE.parent / "tests" / "backends" / "anthropic" / "messages_loopback.py"
#: ``--kind anthropic``: host + connector CPU per token at most this many times the SDK floor.
TARGET_SDK_RATIO = 1.2
PYTHON = sys.executable
#: A process that has not answered by then is stuck, not slow.
TIMEOUT_S = 120.0
#: A fresh host counts as settled once its CPU time stays the same for this long.
SETTLE_S = 0.3
#: ... and is timed anyway after this long.
SETTLE_BOUND_S = 20.0
#: ``--kind openai``: host + connector CPU per token at most this many times the floor.
TARGET_FLOOR_RATIO = 1.2
TARGET_WARM_MS = 3.0
TARGET_FIRST_MS = 5.0
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes ``pids`` have used so far (threads included)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            # The command name may hold spaces; the fields after its closing paren do not.
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total * _TICK_S


def cpu_ns(pids: list[int]) -> int:
    """Nanoseconds the live threads of ``pids`` have run on a CPU (``schedstat``): exact
    where ``cpu_seconds`` counts 10 ms ticks, for the few milliseconds of one short prompt."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
    return total


def clean_env(home: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MAPLE_ACP_", "XDG_"))
    }
    env.update(HOME=os.fspath(home), XDG_CONFIG_HOME=os.fspath(home / "cfg"))
    return env


class LineClient:
    """A minimal blocking ACP client over the connector's stdin/stdout."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._next_id = 0

    def send(self, method: str, params: Any) -> int:
        self._next_id += 1
        request = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        self._stdin.write(json.dumps(request).encode() + b"\n")
        self._stdin.flush()
        return self._next_id

    def call(self, method: str, params: Any) -> tuple[Any, int]:
        """Send a request; its result and how many agent-message chunks came first (updates
        are not parsed: a client that parses every line measures itself)."""
        request_id = self.send(method, params)
        chunks = 0
        readline = self._stdout.readline
        while True:
            line = readline()
            if not line:
                raise RuntimeError(f"the connector closed its stdout during {method}")
            if b'"session/update"' in line:
                chunks += b'"agent_message_chunk"' in line
                continue
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"], chunks


class LoopbackServer:
    """The loopback model server process and the arrival lines it prints."""

    def __init__(self, scratch: Path, tokens: int, script: Path = SERVER) -> None:
        port_file = scratch / "port"
        self.process = subprocess.Popen(
            [PYTHON, str(script), str(port_file), str(tokens)], stdout=subprocess.PIPE
        )
        deadline = time.monotonic() + TIMEOUT_S
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the loopback server did not start")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def arrival_ns(self) -> int:
        """When the next chat request (in order) arrived."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith(b"arrived "):
            raise RuntimeError(f"the loopback server said {line!r}")
        return int(line.split()[1])

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=TIMEOUT_S)


def floor_cpu(server: LoopbackServer) -> tuple[float, int]:
    """CPU seconds of this process to read one stream and ``orjson.loads`` each event."""
    body = json.dumps(
        {"model": "bench-model", "messages": [{"role": "user", "content": "go"}], "stream": True}
    ).encode()
    start = time.process_time()
    connection = http.client.HTTPConnection("127.0.0.1", server.port)
    connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = connection.getresponse()
    tokens = 0
    pending = b""
    loads = orjson.loads
    while True:
        data = response.read1(65536)
        if not data:
            break
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                event = loads(line[6:])
                choices = event["choices"]
                if choices and choices[0]["delta"].get("content"):
                    tokens += 1
    connection.close()
    used = time.process_time() - start
    server.arrival_ns()
    return used, tokens


def sdk_floor_cpu(server: LoopbackServer, client: Any) -> tuple[float, int]:
    """CPU seconds of this process to read one Messages stream through the ``anthropic`` SDK's
    own (synchronous) stream: every event built and typed as the SDK does."""
    start = time.process_time()
    tokens = 0
    stream = client.messages.create(
        model="bench-model",
        max_tokens=8192,
        messages=[{"role": "user", "content": "go"}],
        stream=True,
    )
    with stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                tokens += 1
    used = time.process_time() - start
    server.arrival_ns()
    return used, tokens


class Host:
    """``maple-acp serve`` with the loopback provider, and a connector to it."""

    def __init__(
        self, scratch: Path, base_url: str, kind: str = "openai", checkout: Path | None = None
    ) -> None:
        """``checkout``: run the host and the connector of that source tree instead of the
        installed ones."""
        self.scratch = scratch
        self.project = scratch / "project"
        self.project.mkdir(parents=True, exist_ok=True)
        socket_path = scratch / "run" / "acp.sock"
        env = clean_env(scratch)
        if checkout is not None:
            env["PYTHONPATH"] = os.pathsep.join((str(checkout), str(checkout / "connector")))
        self.started = time.monotonic()
        self.host = subprocess.Popen(
            [
                *(PYTHON, "-m", "maple_acp._main", "serve", "--socket", str(socket_path)),
                *("--data-dir", str(scratch / "data"), "--log-level", "warning"),
                *("--provider-url", base_url, "--model", "bench-model"),
                *("--provider-kind", kind),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert self.host.stderr is not None
        while True:
            line = self.host.stderr.readline()
            if not line:
                raise RuntimeError("maple-acp serve exited before it was ready")
            if line.startswith(b"maple-acp: serving on "):
                break
        self.ready_s = time.monotonic() - self.started
        self.connector: subprocess.Popen[bytes] | None = None
        self.client: LineClient | None = None
        self._env = env
        self._socket = socket_path

    def settle(self) -> None:
        """Wait until the host's CPU time stops moving (what it does in the background after
        it is ready is done)."""
        deadline = time.monotonic() + SETTLE_BOUND_S
        last = cpu_seconds([self.host.pid])
        while time.monotonic() < deadline:
            time.sleep(SETTLE_S)
            now = cpu_seconds([self.host.pid])
            if now == last:
                return
            last = now

    def connect(self) -> LineClient:
        self.connector = subprocess.Popen(
            [PYTHON, "-m", "maple_acp_connector", "--socket", str(self._socket)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self._env,
        )
        assert self.connector.stdin is not None
        assert self.connector.stdout is not None
        self.client = LineClient(self.connector.stdin, self.connector.stdout)
        self.client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        return self.client

    @property
    def pids(self) -> list[int]:
        assert self.connector is not None
        return [self.host.pid, self.connector.pid]

    def new_session(self) -> str:
        assert self.client is not None
        result, _ = self.client.call(
            "session/new", {"cwd": os.fspath(self.project), "mcpServers": []}
        )
        session_id: str = result["sessionId"]
        return session_id

    def prompt(self, session_id: str, text: str) -> tuple[dict[str, Any], int, int]:
        """The answer, the agent-message chunks before it and when the prompt was sent."""
        assert self.client is not None
        sent = time.monotonic_ns()
        result, chunks = self.client.call(
            "session/prompt",
            {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
        )
        if result.get("stopReason") != "end_turn":
            raise RuntimeError(f"the prompt ended {result}")
        return result, chunks, sent

    def close(self) -> None:
        if self.connector is not None:
            assert self.connector.stdin is not None
            self.connector.stdin.close()
            try:
                self.connector.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.connector.kill()
        self.host.send_signal(signal.SIGTERM)
        try:
            self.host.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.host.kill()


@contextlib.contextmanager
def running(scratch: Path, base_url: str, kind: str = "openai") -> Iterator[Host]:
    host = Host(scratch, base_url, kind)
    try:
        yield host
    finally:
        host.close()


def _runs(values: list[float], scale: float, fmt: str = ".1f") -> str:
    return ", ".join(format(v * scale, fmt) for v in values)


def _verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000, help="tokens per streamed answer")
    parser.add_argument("--runs", type=int, default=20, help="CPU runs, each side")
    parser.add_argument("--latency-runs", type=int, default=20, help="prompts per latency figure")
    parser.add_argument("--skip-first", action="store_true", help="skip the fresh-host figure")
    parser.add_argument(
        "--kind", choices=("openai", "anthropic"), default="openai", help="the provider protocol"
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="macp-bp-"))
    anthropic_kind = args.kind == "anthropic"
    server = LoopbackServer(scratch, args.tokens, MESSAGES_SERVER if anthropic_kind else SERVER)
    floor_of: Any = floor_cpu
    sdk_client: Any = None
    if anthropic_kind:
        import anthropic

        sdk_client = anthropic.Anthropic(
            api_key="bench", base_url=server.base_url.removesuffix("/v1"), max_retries=0
        )

        def floor_of(server: LoopbackServer) -> tuple[float, int]:
            return sdk_floor_cpu(server, sdk_client)

    try:
        ours_cpu: list[float] = []
        floor: list[float] = []
        warm_ms: list[float] = []
        first_ms: list[float] = []
        warm_cpu_ms: list[float] = []
        first_cpu_ms: list[float] = []
        ready_s: list[float] = []
        with running(scratch / "warm", server.base_url, args.kind) as host:
            host.connect()
            # One warm-up of each: imports, first connections.
            host.prompt(host.new_session(), "go")
            server.arrival_ns()
            floor_of(server)
            for _ in range(args.runs):
                session_id = host.new_session()
                before_ns = cpu_ns(host.pids)
                _, chunks, _ = host.prompt(session_id, "go")
                ours_cpu.append((cpu_ns(host.pids) - before_ns) / 1e9 / args.tokens)
                server.arrival_ns()
                if chunks < 1:
                    raise RuntimeError("no text arrived")
                seconds, tokens = floor_of(server)
                if tokens != args.tokens:
                    raise RuntimeError(f"the floor read {tokens} of {args.tokens} tokens")
                floor.append(seconds / tokens)
            for _ in range(args.latency_runs):
                session_id = host.new_session()
                before_ns = cpu_ns(host.pids)
                _, _, sent = host.prompt(session_id, "1")
                warm_cpu_ms.append((cpu_ns(host.pids) - before_ns) / 1e6)
                warm_ms.append((server.arrival_ns() - sent) / 1e6)
        if not args.skip_first:
            for index in range(args.latency_runs):
                with running(scratch / f"first{index}", server.base_url, args.kind) as host:
                    ready_s.append(host.ready_s)
                    host.settle()
                    host.connect()
                    session_id = host.new_session()
                    before_ns = cpu_ns(host.pids)
                    _, _, sent = host.prompt(session_id, "1")
                    first_cpu_ms.append((cpu_ns(host.pids) - before_ns) / 1e6)
                    first_ms.append((server.arrival_ns() - sent) / 1e6)
    finally:
        if sdk_client is not None:
            sdk_client.close()
        server.close()
        shutil.rmtree(scratch, ignore_errors=True)

    cpu_us = statistics.median(ours_cpu) * 1e6
    total_us = sum(ours_cpu) / len(ours_cpu) * 1e6
    floor_us = statistics.median(floor) * 1e6
    # Each run of ours is paired with the floor run right after it: the ratio of the pair is
    # what a slow moment of the machine changes least.
    ratios = [ours / below for ours, below in zip(ours_cpu, floor, strict=True)]
    ratio = statistics.median(ratios)
    target = TARGET_SDK_RATIO if anthropic_kind else TARGET_FLOOR_RATIO
    print(
        f"provider path ({args.kind}): {args.tokens} tokens per answer, one per SSE event; "
        f"{args.runs} alternating runs (python {sys.version.split()[0]})"
    )
    print(f"  host + connector CPU per token: {cpu_us:6.1f} us median, {total_us:6.1f} us mean")
    print(f"    runs: {_runs(ours_cpu, 1e6)}")
    if anthropic_kind:
        print(f"  floor (the anthropic SDK's own stream): {floor_us:6.2f} us per token")
    else:
        print(f"  floor (raw bytes + orjson.loads per event): {floor_us:6.2f} us per token")
    print(f"    runs: {_runs(floor, 1e6, '.2f')}")
    print(
        f"  ours / floor, median of the pairs: {ratio:.2f}x "
        f"({_verdict(ratio <= target)} <= {target:.1f})"
    )
    print(f"    pairs: {_runs(ratios, 1, '.2f')}")
    warm = statistics.median(warm_ms)
    print(
        f"  session/prompt -> request at the server, warm: {warm:6.2f} ms median "
        f"({_verdict(warm <= TARGET_WARM_MS)} <= {TARGET_WARM_MS:.0f}; "
        f"{warm / TARGET_WARM_MS:.2f}x it)"
    )
    print(f"    runs: {_runs(warm_ms, 1, '.2f')}")
    print(
        f"    host + connector CPU for the whole one-token prompt: "
        f"{statistics.median(warm_cpu_ms):.2f} ms median"
    )
    if first_ms:
        first = statistics.median(first_ms)
        print(
            f"  session/prompt -> request at the server, a fresh host's first prompt: "
            f"{first:6.2f} ms median ({_verdict(first <= TARGET_FIRST_MS)} <= "
            f"{TARGET_FIRST_MS:.0f}; {first / TARGET_FIRST_MS:.2f}x it)"
        )
        print(f"    runs: {_runs(first_ms, 1, '.2f')}")
        print(
            f"    host + connector CPU for the whole one-token prompt: "
            f"{statistics.median(first_cpu_ms):.2f} ms median"
        )
        print(f"  host start -> ready: {statistics.median(ready_s):.2f} s median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
