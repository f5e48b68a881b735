"""Load a fuzz target from ``fuzz/`` by path, so the suite can drive its entry point with
Hypothesis (the targets are scripts, not an importable package)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

FUZZ_DIR = Path(__file__).resolve().parent.parent / "fuzz"


@functools.cache
def load_fuzz_target(name: str) -> ModuleType:
    """The module ``fuzz/<name>.py``, executed once per test process."""
    spec = importlib.util.spec_from_file_location(name, FUZZ_DIR / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
