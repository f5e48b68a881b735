"""Runs the frames fuzz target under Hypothesis, so a crash it can find fails the suite."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from fuzz_targets import load_fuzz_target
from hypothesis import example, given, settings
from hypothesis import strategies as st

fuzz_one: Callable[[bytes], None] = load_fuzz_target("fuzz_frames").fuzz_one

# orjson encodes 64-bit integers only.
_ints = st.integers(-(2**63), 2**63 - 1)
_json_values = st.recursive(
    st.none() | st.booleans() | _ints | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
_envelope_keys = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"])
_envelopes = st.dictionaries(
    _envelope_keys,
    st.one_of(
        st.just("2.0"),
        _ints,
        st.text(max_size=8),
        st.fixed_dictionaries({"code": _ints, "message": st.text()}),
        _json_values,
    ),
)
_lines = st.one_of(
    _envelopes.map(orjson.dumps),
    _json_values.map(orjson.dumps),
    st.binary(max_size=80),
)
_streams = st.lists(
    st.tuples(_lines, st.sampled_from([b"\n", b"\r\n", b"\n\n", b" \n", b""])),
    max_size=8,
).map(lambda parts: b"".join(line + end for line, end in parts))


@settings(max_examples=300)
@given(chunk=st.integers(0, 255), stream=_streams)
@example(chunk=0, stream=b'{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}\r\n')
@example(chunk=3, stream=b"x" * 600 + b"\n")
def test_structured_streams(chunk: int, stream: bytes) -> None:
    fuzz_one(bytes([chunk]) + stream)


@settings(max_examples=200)
@given(st.binary(max_size=2000))
def test_raw_bytes(data: bytes) -> None:
    fuzz_one(data)
