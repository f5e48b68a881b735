"""The provider path of two source trees side by side: this checkout against another one
(another branch's worktree, or the commit before a change), in one run.

Run: ``python bench/bench_provider_pair.py OTHER_CHECKOUT [--tokens N] [--pairs P]
[--first-pairs F]``. Prints plain text.

On a machine others share, figures taken one run after another differ more than most changes
do; taken at once they meet the same moments. So one host of each tree runs at the same time
(each with its own connector, both on the loopback model server of ``bench_provider``), and
their prompts alternate: a 2,000-token answer each (host + connector CPU per token, the floor's
run after each pair), then one-token prompts (``session/prompt`` -> the request at the server,
and the host's CPU for the prompt), then fresh hosts of each tree in turn for the first prompt.
Each figure is given for both trees with the median of the ratios of its pairs (this / other):
the ratio, not either figure, is what a change is judged by.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_provider import SERVER, TARGET_FLOOR_RATIO, Host, LoopbackServer, cpu_ns, floor_cpu

HERE = Path(__file__).resolve().parent.parent


def _figures(values: list[float]) -> str:
    ordered = sorted(values)
    return f"median {statistics.median(ordered):7.2f}, fastest {ordered[0]:7.2f}"


def _pairs(ours: list[float], theirs: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def _alternate(
    count: int, run: Callable[[str], None], after: Callable[[], None] | None = None
) -> None:
    """``run("this")`` and ``run("other")`` ``count`` times, who goes first alternating;
    ``after()`` after each pair."""
    for index in range(count):
        for side in ("this", "other") if index % 2 == 0 else ("other", "this"):
            run(side)
        if after is not None:
            after()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other source tree (a checkout)")
    parser.add_argument("--tokens", type=int, default=2000, help="tokens per streamed answer")
    parser.add_argument("--pairs", type=int, default=16, help="CPU and warm-latency pairs")
    parser.add_argument("--first-pairs", type=int, default=8, help="fresh-host pairs")
    args = parser.parse_args()
    trees = {"this": HERE, "other": args.other.resolve()}
    scratch = Path(tempfile.mkdtemp(prefix="macp-bpp-"))
    cpu: dict[str, list[float]] = {"this": [], "other": []}
    warm: dict[str, list[float]] = {"this": [], "other": []}
    warm_cpu: dict[str, list[float]] = {"this": [], "other": []}
    first: dict[str, list[float]] = {"this": [], "other": []}
    floor: list[float] = []
    try:
        server = LoopbackServer(scratch, args.tokens, SERVER)
        try:
            with contextlib.ExitStack() as hosts:
                host = {}
                for side, tree in trees.items():
                    host[side] = Host(scratch / side, server.base_url, checkout=tree)
                    hosts.callback(host[side].close)
                    host[side].connect()
                    host[side].prompt(host[side].new_session(), "go")
                    server.arrival_ns()
                floor_cpu(server)

                def streamed(side: str) -> None:
                    session = host[side].new_session()
                    before = cpu_ns(host[side].pids)
                    host[side].prompt(session, "go")
                    cpu[side].append((cpu_ns(host[side].pids) - before) / 1e3 / args.tokens)
                    server.arrival_ns()

                def one_token(side: str) -> None:
                    session = host[side].new_session()
                    before = cpu_ns([host[side].host.pid])
                    _, _, sent = host[side].prompt(session, "1")
                    warm_cpu[side].append((cpu_ns([host[side].host.pid]) - before) / 1e6)
                    warm[side].append((server.arrival_ns() - sent) / 1e6)

                def below() -> None:
                    seconds, tokens = floor_cpu(server)
                    floor.append(seconds / tokens * 1e6)

                _alternate(args.pairs, streamed, below)
                _alternate(args.pairs, one_token)

            def fresh(side: str) -> None:
                index = len(first[side])
                with contextlib.closing(
                    Host(scratch / f"{side}{index}", server.base_url, checkout=trees[side])
                ) as new:
                    new.settle()
                    new.connect()
                    session = new.new_session()
                    _, _, sent = new.prompt(session, "1")
                    first[side].append((server.arrival_ns() - sent) / 1e6)

            _alternate(args.first_pairs, fresh)
        finally:
            server.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"provider path, this tree ({trees['this']}) / the other ({trees['other']})")
    print(f"  {args.tokens}-token answers, host + connector CPU per token (us):")
    for side in trees:
        ratio = _pairs(cpu[side], floor)
        print(
            f"    {side:5s} {_figures(cpu[side])}; / floor {ratio:.2f}x "
            f"({'meets' if ratio <= TARGET_FLOOR_RATIO else 'MISSES'} <= {TARGET_FLOOR_RATIO})"
        )
    print(f"    floor {_figures(floor)}")
    print(f"    this / other, median of the pairs: {_pairs(cpu['this'], cpu['other']):.3f}x")
    print("  session/prompt -> request at the server, warm (ms):")
    for side in trees:
        print(f"    {side:5s} {_figures(warm[side])}; host CPU {_figures(warm_cpu[side])}")
    print(f"    this / other, median of the pairs: {_pairs(warm['this'], warm['other']):.3f}x")
    print("  session/prompt -> request at the server, a fresh host's first prompt (ms):")
    for side in trees:
        print(f"    {side:5s} {_figures(first[side])}")
    print(f"    this / other, median of the pairs: {_pairs(first['this'], first['other']):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
