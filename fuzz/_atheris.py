"""What every fuzz target shares when it runs under atheris (imported from ``main`` only, so
that the test suite can load a target's ``fuzz_one`` without atheris or this directory on the
path).

Each target ``fuzz/fuzz_NAME.py`` keeps its seed corpus in ``fuzz/seeds/fuzz_NAME/`` (small
files, committed). :func:`run` starts libFuzzer with:

- a scratch directory first (libFuzzer writes the inputs it finds interesting into the *first*
  corpus directory; the committed seeds stay as they are) and the seed directory second;
- ``-artifact_prefix`` pointing into the seed directory, so a crash or a hang leaves its input
  there as ``crash-*`` / ``timeout-*``, where the default test suite replays it on every run
  until the defect is fixed and the file becomes an ordinary seed;
- ``-timeout=1``: an input that takes longer than one second is a hang;
- for JSON seeds, a token dictionary of every key and string in them.

Arguments given on the command line win: a positional directory replaces the corpus pair, an
explicit ``-timeout=``, ``-artifact_prefix=`` or ``-dict=`` replaces the default.
"""

from __future__ import annotations

import atexit
import json
import shutil
import signal
import sys
import tempfile
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

FUZZ_DIR = Path(__file__).resolve().parent
SEEDS_DIR = FUZZ_DIR / "seeds"
#: Seconds one input may take before libFuzzer reports a hang.
HANG_TIMEOUT_S = 1


def instrument_module(atheris: Any, module: types.ModuleType) -> None:
    """Instrument the functions and methods defined in ``module`` for coverage feedback."""
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        members = vars(value).values() if isinstance(value, type) else [value]
        for member in members:
            function = getattr(member, "__func__", member)
            if isinstance(function, types.FunctionType):
                atheris.instrument_func(function)


def _collect_tokens(value: object, tokens: set[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            tokens.add(key)
            _collect_tokens(item, tokens)
    elif isinstance(value, list):
        for item in value:
            _collect_tokens(item, tokens)
    elif isinstance(value, str) and 0 < len(value) <= 64:
        tokens.add(value)


def _dictionary(seeds: Path, work: Path) -> Path | None:
    """A libFuzzer dictionary of the keys and short strings of the JSON seeds, if any."""
    tokens: set[str] = set()
    for path in sorted(seeds.iterdir()):
        data = path.read_bytes()
        # Targets whose first byte picks a mode carry their JSON after it, one or more lines.
        for text in (data, *data[1:].splitlines()):
            try:
                _collect_tokens(json.loads(text), tokens)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            break
    if not tokens:
        return None
    dictionary = work / "tokens.dict"
    # libFuzzer's dictionary syntax: one quoted token per line, with \\ and \" escaped.
    lines = []
    for token in sorted(tokens):
        quoted = json.dumps(token).replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'"{quoted}"\n')
    dictionary.write_text("".join(lines))
    return dictionary


def fuzzer_arguments(name: str, argv: list[str], max_len: int | None = None) -> list[str]:
    """``argv`` completed with the corpus pair, the artifact prefix, the hang timeout, a
    dictionary and the target's input size bound, each unless ``argv`` already says otherwise."""
    args = list(argv)
    options = [arg for arg in args[1:] if arg.startswith("-")]
    positional = [arg for arg in args[1:] if not arg.startswith("-")]
    seeds = SEEDS_DIR / name
    seeds.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{name}_"))
    # What libFuzzer keeps of a run is scratch: the seeds that matter are committed.
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    if not positional:
        (work / "corpus").mkdir()
        args += [str(work / "corpus"), str(seeds)]
    if not any(arg.startswith("-artifact_prefix=") for arg in options):
        args.append(f"-artifact_prefix={seeds}/")
    if not any(arg.startswith("-timeout=") for arg in options):
        args.append(f"-timeout={HANG_TIMEOUT_S}")
    if max_len is not None and not any(arg.startswith("-max_len=") for arg in options):
        args.append(f"-max_len={max_len}")
    if not any(arg.startswith("-dict=") for arg in options):
        dictionary = _dictionary(seeds, work)
        if dictionary is not None:
            args.append(f"-dict={dictionary}")
    return args


def run(
    name: str,
    fuzz_one: Callable[[bytes], None],
    modules: Iterable[str] | None = None,
    *,
    max_len: int | None = None,
) -> None:
    """Fuzz ``fuzz_one`` under atheris with ``name``'s corpus; instrument ``modules`` (already
    imported), or everything loaded when ``modules`` is ``None``. ``max_len`` bounds the
    inputs libFuzzer makes (default: the larger of 4096 bytes and the largest seed)."""
    try:
        import atheris  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        sys.exit("atheris is not installed; the test suite runs fuzz_one under Hypothesis")
    if modules is None:
        atheris.instrument_all()
    else:
        for module in modules:
            instrument_module(atheris, sys.modules[module])
    # libFuzzer's hang timer (SIGALRM) keeps running after its last input; an interpreter
    # slow to finish (the openai SDK's modules) would die of it after a clean run.
    atexit.register(signal.setitimer, signal.ITIMER_REAL, 0)
    arguments = fuzzer_arguments(name, sys.argv, max_len)
    atheris.Setup(arguments, lambda data: fuzz_one(bytes(data)))
    atheris.Fuzz()
