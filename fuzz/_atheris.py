"""What every fuzz target shares when it runs under atheris (imported from ``main`` only, so
that the test suite can load a target's ``fuzz_one`` without atheris or this directory on the
path)."""

from __future__ import annotations

import types
from typing import Any


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
