"""The provider backend's CPU cost per streamed token, against reading the raw SDK stream.

Run: ``python bench/bench_provider.py [--tokens N] [--runs R]``. Prints plain text; the ratio
measured in one run is what counts.

A loopback OpenAI-compatible server (``tests/backends/openai/loopback.py``) runs in its own
process and answers every chat request with the same stream of N one-token chunks plus a usage
chunk, so this process's CPU time is the client side only.

Baseline: the official ``openai`` SDK over the same ``httpx2`` client settings, iterating the
stream and reading each chunk's text, as the simplest possible consumer would.

Ours: one prompt through the whole runtime (``AgentService`` over a real SQLite file, the
user message admitted, the ``ProviderBackend`` turn, every event read by the caller, the
message written to the store at the end): what an agent costs beyond the stream itself.

Target: ours adds <= 20% CPU per token over the baseline. Runs alternate between the two so
that drift on a shared machine hits both alike; medians are compared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from maple_acp.backends.openai import build_backend, provider_config_from_flags, provider_policy
from maple_acp.backends.openai._client import RequestTimeouts, open_provider_client
from maple_acp.backends.openai._config import ProviderEntry
from maple_acp.runtime import TextChunk
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.store import temp_store

HERE = Path(__file__).resolve().parent
SERVER = HERE.parent / "tests" / "backends" / "openai" / "loopback.py"
#: A server that has not started by then is broken, not slow.
START_TIMEOUT_S = 30.0
TARGET_OVERHEAD = 0.20


async def raw_stream(base_url: str) -> int:
    entry = ProviderEntry(name="bench", base_url=base_url)
    tokens = 0
    async with open_provider_client(entry, None, RequestTimeouts()) as client:
        stream = await client.chat.completions.create(
            model="bench-model",
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                tokens += 1
    return tokens


async def through_runtime(base_url: str, data: Path, project: Path) -> int:
    config = provider_config_from_flags(base_url, "bench-model")
    backend, catalog = build_backend(config, {})
    tokens = 0
    async with temp_store(data) as store:
        service = make_demo_service(
            store, backend=backend, catalog=catalog, policy=provider_policy()
        )
        async with service, trio.open_nursery() as nursery:
            service.sign_in(DEMO_ACCOUNT)
            lease = await nursery.start(service.serve_new_task, str(project))
            run = await lease.start_run("go")
            async for event in run.events():
                if isinstance(event, TextChunk):
                    tokens += 1
            await lease.release(close=True)
    return tokens


def cpu_of(fn: Callable[..., Awaitable[int]], *args: object) -> tuple[float, int]:
    start = time.process_time()
    tokens = trio.run(fn, *args)
    return time.process_time() - start, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen(
            [sys.executable, str(SERVER), str(port_file), str(args.tokens)],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not port_file.exists() or not port_file.read_text().strip():
                if time.monotonic() > deadline or server.poll() is not None:
                    print("the loopback server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            base_url = f"http://127.0.0.1:{port_file.read_text().strip()}/v1"
            # One warm-up of each (imports, first connections).
            cpu_of(raw_stream, base_url)
            project = Path(tmp) / "project"
            project.mkdir()
            raw: list[float] = []
            ours: list[float] = []
            for index in range(args.runs + 1):
                data = Path(tmp) / f"data{index}"
                data.mkdir()
                seconds, tokens = cpu_of(through_runtime, base_url, data, project)
                if tokens != args.tokens:
                    print(f"the runtime saw {tokens} of {args.tokens} tokens", file=sys.stderr)
                    return 1
                if index:
                    ours.append(seconds / tokens)
                seconds, tokens = cpu_of(raw_stream, base_url)
                if tokens != args.tokens:
                    print(f"the raw stream gave {tokens} of {args.tokens} tokens", file=sys.stderr)
                    return 1
                if index:
                    raw.append(seconds / tokens)
        finally:
            server.terminate()
            server.wait()
    raw_us = statistics.median(raw) * 1e6
    ours_us = statistics.median(ours) * 1e6
    overhead = ours_us / raw_us - 1
    print(f"tokens per stream: {args.tokens}, runs: {args.runs} (python {sys.version.split()[0]})")
    print(f"raw SDK stream:        {raw_us:7.2f} us CPU per token (median)")
    print(f"through the runtime:   {ours_us:7.2f} us CPU per token (median)")
    print(f"overhead: {overhead:+.1%} (target <= {TARGET_OVERHEAD:.0%})")
    print(f"runs raw:  {', '.join(f'{v * 1e6:.2f}' for v in raw)}")
    print(f"runs ours: {', '.join(f'{v * 1e6:.2f}' for v in ours)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
