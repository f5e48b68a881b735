"""Host memory while a stalled client faces a backend streaming 10^6 updates.

Run: ``python bench/bench_memory.py [--updates N] [--seconds S]``. Prints plain text.

A ``maple-acp serve`` subprocess is warmed with one fully read ``/stream`` prompt; its resident
set size (``VmRSS``) then is the baseline. A client on the raw socket opens a session, asks for
``/stream N 100`` and stops reading. The host may buffer only what its bounds allow (the socket
buffers, ~4 MiB / 256 lines of outbound credit, a 256-event run queue), so its RSS must level
off instead of growing with N. The peak RSS over the stalled window, minus the baseline, is the
figure; target <= 8 MiB. The client then cancels the prompt and reads to its answer: the few
chunks it reads are all the host held back for it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_throughput import LineClient, running_host

MIB = 1024 * 1024
#: How often the host's RSS is sampled while the client is stalled.
SAMPLE_INTERVAL_S = 0.02
TARGET_MIB = 8.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="stalled window")
    args = parser.parse_args()
    if not os.path.exists("/proc/self/status"):
        print("bench_memory needs /proc (Linux); skipped")
        return 0

    scratch = Path(tempfile.mkdtemp(prefix="macp-bench-"))
    project = scratch / "project"
    project.mkdir()
    try:
        with running_host(scratch) as (host, socket_path):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(socket_path))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader = sock.makefile("rb")
            writer = sock.makefile("wb")
            client = LineClient(writer, reader)
            client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            session = client.call("session/new", {"cwd": str(project), "mcpServers": []})[0][
                "sessionId"
            ]

            def prompt(text: str) -> int:
                blocks = [{"type": "text", "text": text}]
                return client.send("session/prompt", {"sessionId": session, "prompt": blocks})

            client.answer(prompt("/stream 20000 100"))
            baseline = rss_bytes(host.pid)

            stalled = prompt(f"/stream {args.updates} 100")
            peak = baseline
            samples = 0
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                peak = max(peak, rss_bytes(host.pid))
                samples += 1
                time.sleep(SAMPLE_INTERVAL_S)
            client.notify("session/cancel", {"sessionId": session})
            result, received = client.answer(stalled)
            peak = max(peak, rss_bytes(host.pid))
            sock.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    growth = (peak - baseline) / MIB
    print(f"host memory with a stalled client, /stream {args.updates} 100")
    print(f"  baseline RSS after a warm-up prompt: {baseline / MIB:8.1f} MiB")
    print(
        f"  peak RSS over {args.seconds:.1f} s stalled ({samples} samples): {peak / MIB:8.1f} MiB"
    )
    print(
        f"  growth: {growth:.1f} MiB (target <= {TARGET_MIB:.0f} MiB: "
        f"{'meets' if growth <= TARGET_MIB else 'MISSES'})"
    )
    print(
        f"  after session/cancel: stopReason {result.get('stopReason')}; the client then read "
        f"{received:,} of the {args.updates:,} chunks (the rest were never produced)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
