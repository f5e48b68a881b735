"""Every exception class the library defines is in the documented tree or named, with its
reason, among the few kept outside it (``maple_acp._exceptions``' docstring)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import maple_acp
from maple_acp import _exceptions
from maple_acp._exceptions import MapleAcpError


def _library_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(maple_acp.__path__, "maple_acp."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.split(".")[0] == "maple_acp"
            ):
                found[name] = value
    return found


def test_every_exception_is_in_the_tree_or_named_outside_it() -> None:
    doc = _exceptions.__doc__ or ""
    tree, _, outside = doc.partition("Not part of the tree")
    in_tree = set(re.findall(r"\+-- (\w+)", tree))
    named_outside = set(re.findall(r"``(\w+)``", outside))
    exceptions = _library_exceptions()
    assert len(exceptions) > 20, "the walk found too few exceptions to be a real check"
    for name, cls in exceptions.items():
        if cls is MapleAcpError:
            continue
        if issubclass(cls, MapleAcpError):
            assert name in in_tree, f"{cls.__module__}.{name} is missing from the tree"
        else:
            assert name in named_outside, f"{cls.__module__}.{name} is outside the tree unnamed"
    # Nothing stale: every name the tree shows still exists.
    assert in_tree <= set(exceptions), in_tree - set(exceptions)
