"""Runs the relay hello fuzz target under Hypothesis, from the host's end and the connector's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fuzz_targets import load_fuzz_target
from hypothesis import example, given
from hypothesis import strategies as st

_target = load_fuzz_target("fuzz_relay_hello")
fuzz_one: Callable[[bytes], None] = _target.fuzz_one

_names = st.sampled_from([*sorted(_target.ALLOWED), "OTHER", "1BAD", "", "a-b", "PATH"])
_values = (
    st.text(max_size=40)
    | st.sampled_from(["secret-value-0001", "x\x00secret-value", "é" * 9000])
    | st.integers(0, 20).map(lambda n: "v" * (n * 1024 + n))
)
_environments = st.dictionaries(_names, _values, max_size=20)


def _hello(params: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": "_maple/bridge/hello", "params": params})


@given(_environments)
@example({"TOKEN": "v" * 16 * 1024, "API_KEY": "w" * 16 * 1024, "A": "x"})
@example({"TOKEN": "secret\x00value-0001"})
def test_host_reads_environments(environment: dict[str, str]) -> None:
    fuzz_one(b"\x00" + _hello({"environment": environment}))


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), st.lists, max_leaves=4))
@example([])
@example({"environment": ["TOKEN"]})
@example({"environment": {"TOKEN": 7}})
def test_host_reads_malformed_params(params: Any) -> None:
    if isinstance(params, int) and not -(2**63) <= params < 2**64:
        params = 0
    fuzz_one(b"\x00" + _hello(params))


@given(st.binary(max_size=300))
def test_host_reads_raw_lines(line: bytes) -> None:
    fuzz_one(b"\x00" + line)


@given(
    st.lists(_names | st.text(max_size=6), max_size=20).map(lambda names: ", ".join(names)),
    _environments,
)
@example("TOKEN,TOKEN,A", {"TOKEN": "secret-value-0001", "A": "a"})
@example(",".join(f"V{i}" for i in range(20)), {})
def test_connector_builds_what_the_host_accepts(
    allow_list: str, environment: dict[str, str]
) -> None:
    fuzz_one(b"\x01" + orjson.dumps({"MAPLE_ACP_RELAY_ENV": allow_list, **environment}))


def test_a_long_invalid_name_in_the_allow_list_gives_a_bounded_note() -> None:
    # Found by the fuzzer: the note naming an invalid allow-list entry had no length bound.
    fuzz_one(b"\x01" + orjson.dumps({"MAPLE_ACP_RELAY_ENV": "OK," + ";" * 600}))
