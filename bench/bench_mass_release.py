"""A connection that goes away holding many sessions: how long their release takes, and how
long another connection waits for ``session/new`` meanwhile.

Run: ``python bench/bench_mass_release.py [--sessions N] [--prompted P] [--source DIR]``.
Prints plain text.

A ``maple-acp serve`` subprocess (default config, so at most 256 sessions per connection). A
blocking client opens N sessions on connection A (requests pipelined, 64 at a time) and
prompts P of them, so those tasks are durable and the rest provisional; connection B is open
and warm. Then A's socket is closed, and B times ``session/new`` round trips (each followed
by an untimed ``session/close`` and a ``_maple/status``) until the status shows no lease
left. The release lasts from A's close to that status; its granularity is one loop of B.
B's first call overlaps A's end itself (every lease is revoked at once, synchronously), so
its latency is printed apart from the worst of the later ones, made during the release.
Target (docs/protocol.md, performance targets): B's worst ``session/new`` under 100 ms, the
release within 5 s.

``--source DIR`` runs the host from another checkout, e.g. a worktree of an older commit
(``git worktree add /tmp/wt-before <commit>``), to compare; the client side is this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_throughput import LineClient, running_host

#: Requests in flight at once while connection A sets up its sessions.
PIPELINE = 64
TARGET_WORST_MS = 100.0
RELEASE_BOUND_S = 5.0


def pipelined(client: LineClient, calls: list[tuple[str, Any]]) -> list[Any]:
    """Send ``calls`` ``PIPELINE`` at a time; their results in order (answers may come in any
    order; updates on the way are skipped)."""
    results: list[Any] = []
    readline = client._stdout.readline
    for start in range(0, len(calls), PIPELINE):
        ids = [client.send(method, params) for method, params in calls[start : start + PIPELINE]]
        answers: dict[int, Any] = {}
        while len(answers) < len(ids):
            line = readline()
            if not line:
                raise RuntimeError("the host closed the connection")
            if b'"session/update"' in line:
                continue
            message = json.loads(line)
            if "error" in message:
                raise RuntimeError(f"request {message.get('id')} failed: {message['error']}")
            answers[message["id"]] = message["result"]
        results.extend(answers[i] for i in ids)
    return results


def connect(socket_path: Path) -> tuple[socket.socket, LineClient]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(socket_path))
    client = LineClient(sock.makefile("wb"), sock.makefile("rb"))
    client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    return sock, client


def measure(
    socket_path: Path, project: Path, sessions: int, prompted: int, *, verbose: bool
) -> None:
    params = {"cwd": str(project), "mcpServers": []}
    sock_a, client_a = connect(socket_path)
    sock_b, client_b = connect(socket_path)
    with sock_b:
        warm = client_b.call("session/new", params)[0]["sessionId"]
        client_b.call("session/close", {"sessionId": warm})

        opened = time.perf_counter()
        sids = [r["sessionId"] for r in pipelined(client_a, [("session/new", params)] * sessions)]
        prompt = [{"type": "text", "text": "/echo durable"}]
        pipelined(
            client_a,
            [("session/prompt", {"sessionId": sid, "prompt": prompt}) for sid in sids[:prompted]],
        )
        leases = client_b.call("_maple/status", {})[0]["leases"]
        print(
            f"  connection A holds {leases} leases ({prompted} prompted), set up in"
            f" {time.perf_counter() - opened:.1f} s"
        )

        latencies: list[float] = []
        trace: list[str] = []
        sock_a.shutdown(socket.SHUT_RDWR)
        sock_a.close()
        released = time.perf_counter()
        while True:
            started = time.perf_counter()
            sid = client_b.call("session/new", params)[0]["sessionId"]
            latencies.append((time.perf_counter() - started) * 1000)
            client_b.call("session/close", {"sessionId": sid})
            left = client_b.call("_maple/status", {})[0]["leases"]
            trace.append(
                f"{(started - released) * 1000:.0f}+{latencies[-1]:.0f}ms (then {left} leases)"
            )
            if left == 0:
                break
        duration = time.perf_counter() - released
        if verbose:
            print("  B's session/new calls, from A's close:", ", ".join(trace))

    worst = max(latencies)
    # The first call overlaps A's end itself: the synchronous revocation of every lease.
    later = max(latencies[1:], default=0.0)
    print(f"  release of {sessions} sessions: {duration:.3f} s (bound {RELEASE_BOUND_S:.0f} s)")
    print(
        f"  session/new on connection B meanwhile: {len(latencies)} calls,"
        f" worst {worst:.1f} ms (first {latencies[0]:.1f}, worst later {later:.1f}),"
        f" median {statistics.median(latencies):.1f} ms"
        f" (target worst < {TARGET_WORST_MS:.0f} ms:"
        f" {'meets' if worst < TARGET_WORST_MS else 'MISSES'})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--prompted", type=int, default=None, help="default: half")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="print every call of B")
    parser.add_argument("--source", type=Path, default=None, help="checkout to run the host from")
    args = parser.parse_args()
    prompted = args.sessions // 2 if args.prompted is None else args.prompted
    if args.source is not None:
        # The host subprocess imports maple_acp from there, ahead of this checkout (which
        # ``python -m`` would otherwise find first as the working directory).
        source = str(args.source.resolve())
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [source, os.environ.get("PYTHONPATH")])
        )
        os.chdir(source)
    where = subprocess.run(
        [sys.executable, "-c", "import maple_acp; print(maple_acp.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    print(
        f"mass release: {args.sessions} sessions on one connection, {prompted} prompted,"
        f" host code from {os.path.dirname(os.path.dirname(where))}"
    )
    for run in range(args.runs):
        scratch = Path(tempfile.mkdtemp(prefix="macp-bench-"))
        project = scratch / "project"
        project.mkdir()
        try:
            with running_host(scratch) as (_, socket_path):
                print(f"run {run + 1}:")
                measure(socket_path, project, args.sessions, prompted, verbose=args.verbose)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
