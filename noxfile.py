"""Developer sessions: tests, lint, typecheck, fuzz, bench, demo.

The default test suite runs the fuzz targets and property tests briefly; the ``fuzz`` and
``long`` sessions run them for longer.
"""

from __future__ import annotations

import nox

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
    """Each atheris target for a bounded number of executions (``-- RUNS`` to change it)."""
    session.install("-e", ".", "atheris")
    runs = session.posargs[0] if session.posargs else "200000"
    for target in sorted(__import__("pathlib").Path("fuzz").glob("fuzz_*.py")):
        session.run("python", str(target), f"-atheris_runs={runs}")


@nox.session
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks; each prints ratios measured in one run. The official Python
    ACP SDK is installed here only, as the throughput baseline."""
    session.install("-e", ".", "agent-client-protocol")
    for script in sorted(__import__("pathlib").Path("bench").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """A scripted ACP session through a real connector, printed as a transcript."""
    session.install("-e", ".")
    session.run("maple-acp", "demo")
