"""``session/new`` latency with a warm model catalog, through the real socket.

Run: ``python bench/bench_session_new.py [--sessions N]``. Prints plain text.

A ``maple-acp serve`` subprocess; a blocking client on its socket sends ``initialize`` and one
``session/new`` to warm the catalog cache, then times N ``session/new`` round trips (each
followed by an untimed ``session/close``, which deletes the never-prompted task). Target: p50
<= 20 ms. The client's own share is small: a plain round trip on a Unix socket is ~40 us here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_throughput import LineClient, running_host

TARGET_P50_MS = 20.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="macp-bench-"))
    project = scratch / "project"
    project.mkdir()
    latencies: list[float] = []
    try:
        with (
            running_host(scratch) as (_, socket_path),
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
        ):
            sock.connect(str(socket_path))
            client = LineClient(sock.makefile("wb"), sock.makefile("rb"))
            client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            params = {"cwd": str(project), "mcpServers": []}
            warm = client.call("session/new", params)[0]["sessionId"]
            client.call("session/close", {"sessionId": warm})
            for _ in range(args.sessions):
                started = time.perf_counter()
                session = client.call("session/new", params)[0]["sessionId"]
                latencies.append((time.perf_counter() - started) * 1000)
                client.call("session/close", {"sessionId": session})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    latencies.sort()
    p50 = statistics.median(latencies)
    p90 = latencies[int(len(latencies) * 0.9) - 1]
    print(f"session/new latency, warm catalog, {args.sessions} sessions over the socket")
    print(f"  p50 {p50:.2f} ms, p90 {p90:.2f} ms, max {latencies[-1]:.2f} ms")
    print(
        f"  target p50 <= {TARGET_P50_MS:.0f} ms: {'meets' if p50 <= TARGET_P50_MS else 'MISSES'}"
        f" ({p50 / TARGET_P50_MS:.2f} of the budget)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
