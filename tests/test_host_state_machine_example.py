"""``examples/host_state_machine.py``, the state machine a host copies for its own property
test, runs green in the default suite with the example count it ships with: 200 examples
over its own echo engine (about 25 s on two busy cores)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "host_state_machine.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("host_state_machine_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_example_host_machine_runs_its_200_examples_green() -> None:
    example = load_example()
    case = example.HostMachine.TestCase
    assert case.settings.max_examples == 200
    case("runTest").runTest()


def test_the_example_fits_in_a_page() -> None:
    # What a host copies and adapts: short enough to read whole.
    assert len(EXAMPLE.read_text().splitlines()) <= 150
