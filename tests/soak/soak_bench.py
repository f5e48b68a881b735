"""Load ``bench/soak.py`` by path (bench/ is a directory of scripts, not a package)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SOAK_PATH = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@functools.cache
def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("maple_acp_soak", SOAK_PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class is being built.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
