"""Every input kept in ``fuzz/seeds/`` replayed through its target on every run.

A crash or a hang that ``nox -s fuzz`` finds is written into the target's corpus directory
(``crash-*`` / ``timeout-*``); from then on this test fails on it until the defect is fixed,
after which the file stays as an ordinary seed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_targets import FUZZ_DIR, load_fuzz_target

SEEDS_DIR = FUZZ_DIR / "seeds"
#: A seed larger than this would make the default suite slow and the repository heavy.
MAX_SEED_BYTES = 64 * 1024

TARGETS = sorted(path.stem for path in FUZZ_DIR.glob("fuzz_*.py"))
#: Seeds that show a defect whose fix is on its way, with where it is tracked. Strict: the day
#: the fix lands, the mark must go.
PENDING: dict[str, str] = {}
SEEDS = sorted(
    (target, path)
    for target in TARGETS
    for path in sorted((SEEDS_DIR / target).glob("*"))
    if path.is_file()
)


def test_every_target_has_a_seed_corpus() -> None:
    assert TARGETS
    for target in TARGETS:
        assert any(t == target for t, _ in SEEDS), f"{target} has no seeds in fuzz/seeds"


def _case(target: str, path: Path) -> object:
    name = f"{target}/{path.name}"
    marks = [pytest.mark.xfail(reason=PENDING[name], strict=True)] if name in PENDING else []
    return pytest.param(target, path, id=name, marks=marks)


@pytest.mark.parametrize(("target", "path"), [_case(target, path) for target, path in SEEDS])
def test_seed(target: str, path: Path) -> None:
    data = path.read_bytes()
    assert len(data) <= MAX_SEED_BYTES, "keep committed seeds small"
    load_fuzz_target(target).fuzz_one(data)
