"""Live tool output: host CPU per streamed byte of a command's output against streamed model
text, and the host's memory while a background command prints far more than any buffer.

Run: ``python bench/bench_live_output.py [--mib N] [--background-mib M] [--runs R]``. Prints
plain text; the ratio measured in one run is what counts.

Both sides go through the same host (the demo runtime and the ACP service, in this process,
over an in-memory connection read by the test client): ``/stream`` sends N MiB of agent
message text in 64 KiB chunks; ``/tool shell`` runs a command printing N MiB, which the host
reads and shows as snapshots of its tail. CPU is this process's (the command's own CPU is its
process's, not the host's). Target: the shell's host CPU per byte at most 2x the
text's. Memory: the peak traced allocation while a background command prints M MiB must stay
within a few MiB, whatever M.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import trio

from maple_acp.testing.service import running_demo_acp

CHUNK_BYTES = 64 * 1024
#: The memory the host may use while a background command prints, whatever it prints.
MEMORY_TARGET = 8 * 1024 * 1024


def _print_command(mib: int) -> str:
    return f"head -c {mib * 1024 * 1024} /dev/zero | tr '\\0' x"


async def _measure(mib: int, background_mib: int, runs: int) -> int:
    with tempfile.TemporaryDirectory() as directory:
        project = Path(directory) / "project"
        project.mkdir()
        async with running_demo_acp(directory) as harness, harness.connect() as client:
            sid = (await client.new_session(str(project)))["sessionId"]
            size = mib * 1024 * 1024
            text_costs, shell_costs = [], []
            for _ in range(runs):
                started = time.process_time()
                await client.prompt(sid, f"/stream {size // CHUNK_BYTES} {CHUNK_BYTES}")
                text_costs.append((time.process_time() - started) / size)
                started = time.process_time()
                shell = json.dumps({"command": _print_command(mib)})
                await client.prompt(sid, f"/tool shell {shell}")
                shell_costs.append((time.process_time() - started) / size)
            text = statistics.median(text_costs)
            shell = statistics.median(shell_costs)
            print(f"streamed text:  {text * 1e9:8.2f} ns of host CPU per byte ({mib} MiB)")
            print(f"command output: {shell * 1e9:8.2f} ns of host CPU per byte ({mib} MiB)")
            ratio = shell / text
            print(f"ratio: {ratio:.2f}x (target <= 2x)")

            tracemalloc.start()
            baseline = tracemalloc.get_traced_memory()[0]
            await client.prompt(sid, f"/bg {_print_command(background_mib)}")
            with trio.fail_after(120):
                while True:
                    answer = await client.call(
                        "_session/background", {"sessionId": sid, "action": "list"}
                    )
                    if answer["commands"][0]["status"] == "exited":
                        break
                    await trio.sleep(0.05)
            peak = tracemalloc.get_traced_memory()[1] - baseline
            tracemalloc.stop()
            print(
                f"background command printing {background_mib} MiB: peak host allocation "
                f"{peak / 1024 / 1024:.2f} MiB (target <= {MEMORY_TARGET // 1024 // 1024} MiB)"
            )
            return 0 if ratio <= 2 and peak <= MEMORY_TARGET else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=10)
    parser.add_argument("--background-mib", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    return trio.run(_measure, args.mib, args.background_mib, args.runs)


if __name__ == "__main__":
    sys.exit(main())
