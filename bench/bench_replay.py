"""History replay against live streaming of the same updates, through the connector.

Run: ``python bench/bench_replay.py [--updates N] [--size B] [--runs R]``. Prints plain text;
the ratio measured in one run is what counts.

A prompt of N ``/echo`` lines of B bytes makes the demo backend send N agent messages, and
``/stream N B`` sends N chunks of one message (the fastest live path); each is timed from the
prompt request to its answer. The session is closed and loaded
again on the same connection: the load replays the same N messages before its answer (timed
from the load request to its answer). Both go through ``maple-acp serve`` and a
``maple-acp-connector`` process, read by the same client code as ``bench_throughput.py``; the
runs alternate, each on a fresh session.

Rates count the updates the agent produced (N for each prompt and load) per second; the
client counts their text in characters and checks it whole. The live messages and the replay
are one update per message on the wire too (also checked); the streamed message's chunks may
go out joined into fewer updates (the host sends the chunks it finds queued together as one),
and how many is printed beside its rate.

The host keeps the decoded histories of the tasks it read last, up to date with its own
writes, so a load right after the prompt (the rounds above) finds the history in memory. After
the rounds the host is restarted on the same data directory and each session is loaded once
more: the first read of a task after a restart, the cold figure.

Each session is also loaded against its own live run: the load's time and the host +
connector CPU (``schedstat``, nanoseconds) over the live prompt's, for the streamed message
(its replay is one message, in a few
updates of bounded size) and for the N messages (N updates). The medians of those ratios are
the "replay <= 1.0x the live stream of the same session" figures.

Target: the replay at least as fast as the live stream, complete and in order before the
answer; a session's load at most 1.0x its own live run, in time and in CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from bench_provider import cpu_ns
from bench_throughput import PYTHON, TIMEOUT_S, LineClient, _clean_env, running_host


@attrs.define
class Round:
    """One round's figures."""

    #: Updates per second: N live messages, one live streamed message, the messages' replay.
    live: float
    stream: float
    replay: float
    #: The messages' session (loaded again after a restart) and the stream's updates on the
    #: wire.
    session: str
    stream_updates: int
    #: Each session's load over its own live run: (time, host + connector CPU).
    stream_load: tuple[float, float]
    messages_load: tuple[float, float]


def _timed(
    client: LineClient, pids: list[int], method: str, params: dict[str, Any]
) -> tuple[int, float, float]:
    """Call ``method``: the characters of agent text that came before its answer, the wall
    seconds and the host + connector CPU seconds it took."""
    started, cpu = time.perf_counter(), cpu_ns(pids)
    _, text = client.call(method, params)
    return text, time.perf_counter() - started, (cpu_ns(pids) - cpu) / 1e9


def one_round(client: LineClient, pids: list[int], cwd: str, updates: int, size: int) -> Round:
    """Live messages, a live stream and their loads, on fresh sessions.

    The client counts agent-message text in characters, so each check compares characters:
    ``/stream N B`` sends N chunks of B ``x`` (the host may join chunks it finds queued
    together, so fewer updates can carry them), and each ``/echo`` line's text is one message
    of its own. The live and replayed messages are also counted as updates, one per message:
    a message lost, split or merged with another fails the round. Rates are the updates the
    agent produced (N either way) per second."""
    session = client.call("session/new", {"cwd": cwd, "mcpServers": []})[0]["sessionId"]
    stream = [{"type": "text", "text": f"/stream {updates} {size}"}]
    prompt_params: dict[str, Any] = {"sessionId": session, "prompt": stream}
    streamed, stream_s, stream_cpu = _timed(client, pids, "session/prompt", prompt_params)
    stream_updates = client.chunks
    if streamed != updates * size:
        raise RuntimeError(f"expected {updates * size} streamed characters, got {streamed}")
    client.call("session/close", {"sessionId": session})
    load_params = {"sessionId": session, "cwd": cwd, "mcpServers": []}
    replayed, load_s, load_cpu = _timed(client, pids, "session/load", load_params)
    if replayed != updates * size:
        # A long message replays in pieces of a bounded size: its text must be whole.
        raise RuntimeError(f"the streamed message replayed {replayed} of {updates * size}")
    client.call("session/close", {"sessionId": session})
    stream_load = (load_s / stream_s, load_cpu / stream_cpu)
    session = client.call("session/new", {"cwd": cwd, "mcpServers": []})[0]["sessionId"]
    texts = [str(i).rjust(size, "x") for i in range(updates)]
    echoed = sum(map(len, texts))
    prompt = [{"type": "text", "text": "\n".join(f"/echo {text}" for text in texts)}]
    prompt_params = {"sessionId": session, "prompt": prompt}
    started, cpu = time.perf_counter(), cpu_ns(pids)
    result, live = client.call("session/prompt", prompt_params)
    live_s, live_cpu = time.perf_counter() - started, (cpu_ns(pids) - cpu) / 1e9
    if (live, client.chunks, result.get("stopReason")) != (echoed, updates, "end_turn"):
        raise RuntimeError(
            f"expected {updates} live messages of {echoed} characters in all and end_turn, "
            f"got {client.chunks} of {live}: {result}"
        )
    client.call("session/close", {"sessionId": session})
    load_params = {"sessionId": session, "cwd": cwd, "mcpServers": []}
    replayed, replay_s, replay_cpu = _timed(client, pids, "session/load", load_params)
    _check_replay(client, replayed, updates, echoed)
    client.call("session/close", {"sessionId": session})
    return Round(
        live=updates / live_s,
        stream=updates / stream_s,
        replay=updates / replay_s,
        session=session,
        stream_updates=stream_updates,
        stream_load=stream_load,
        messages_load=(replay_s / live_s, replay_cpu / live_cpu),
    )


def cold_load(client: LineClient, cwd: str, session: str, updates: int, size: int) -> float:
    """Updates per second of a session's first load on this host."""
    started = time.perf_counter()
    _, replayed = client.call("session/load", {"sessionId": session, "cwd": cwd, "mcpServers": []})
    elapsed = time.perf_counter() - started
    echoed = sum(len(str(i).rjust(size, "x")) for i in range(updates))
    _check_replay(client, replayed, updates, echoed)
    client.call("session/close", {"sessionId": session})
    return updates / elapsed


def _check_replay(client: LineClient, replayed: int, updates: int, echoed: int) -> None:
    if (replayed, client.chunks) != (echoed, updates):
        raise RuntimeError(
            f"expected {updates} replayed messages of {echoed} characters in all, "
            f"got {client.chunks} of {replayed}"
        )


@contextlib.contextmanager
def connected(scratch: Path) -> Iterator[tuple[LineClient, list[int]]]:
    """A host on ``scratch``, an initialized client through a connector, and both pids."""
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
            client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            yield client, [host.pid, connector.pid]
            connector.stdin.close()
            connector.wait(timeout=TIMEOUT_S)
        finally:
            if connector.poll() is None:
                connector.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="macp-replay-"))
    live: list[float] = []
    stream: list[float] = []
    replay: list[float] = []
    cold: list[float] = []
    sessions: list[str] = []
    wire: list[int] = []
    loads: list[tuple[tuple[float, float], tuple[float, float]]] = []
    try:
        project = scratch / "project"
        project.mkdir()
        with connected(scratch) as (client, pids):
            for _ in range(args.runs):
                figures = one_round(client, pids, str(project), args.updates, args.size)
                live.append(figures.live)
                stream.append(figures.stream)
                replay.append(figures.replay)
                sessions.append(figures.session)
                wire.append(figures.stream_updates)
                loads.append((figures.stream_load, figures.messages_load))
        with connected(scratch) as (client, _):
            for session in sessions:
                cold.append(cold_load(client, str(project), session, args.updates, args.size))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    live_median = statistics.median(live)
    stream_median = statistics.median(stream)
    replay_median = statistics.median(replay)
    cold_median = statistics.median(cold)
    print(f"history replay vs live streaming, {args.updates} updates of {args.size} bytes")
    print(f"  live, {args.updates} messages:      {live_median:>10,.0f} updates/s  ({_fmt(live)})")
    print(f"  live, one streamed message: {stream_median:>10,.0f} updates/s  ({_fmt(stream)})")
    joined = ", ".join(f"{n:,}" for n in wire)
    print(f"  (the streamed message's {args.updates:,} chunks took {joined} updates on the wire)")
    print(f"  session/load replay:        {replay_median:>10,.0f} updates/s  ({_fmt(replay)})")
    print(f"  first load after a restart: {cold_median:>10,.0f} updates/s  ({_fmt(cold)})")
    for name, rate in (("the same messages live", live_median), ("live streaming", stream_median)):
        ratio = replay_median / rate
        verdict = "meets" if ratio >= 1 else "MISSES"
        print(f"  replay / {name}: {ratio:.2f}x ({verdict} the 1x target)")
    ratio = cold_median / stream_median
    verdict = "meets" if ratio >= 1 else "MISSES"
    print(f"  first load after a restart / live streaming: {ratio:.2f}x ({verdict} the 1x target)")
    print("  a session's load / its own live run (goal <= 1.0x), time and host + connector CPU:")
    for index, name in ((0, "the streamed message"), (1, f"the {args.updates} messages")):
        times = [pair[index][0] for pair in loads]
        cpus = [pair[index][1] for pair in loads]
        worst = max(statistics.median(times), statistics.median(cpus))
        print(
            f"    {name}: {statistics.median(times):.3f}x time, {statistics.median(cpus):.3f}x "
            f"CPU ({'meets' if worst <= 1 else 'MISSES'} the goal)"
        )
    return 0


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
