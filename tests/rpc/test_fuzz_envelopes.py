"""Runs the request-id fuzz target under Hypothesis, so a violation it can find fails the suite."""

from __future__ import annotations

from collections.abc import Callable

from fuzz_targets import load_fuzz_target
from hypothesis import example, given
from hypothesis import strategies as st

_target = load_fuzz_target("fuzz_envelopes")
fuzz_one: Callable[[bytes], None] = _target.fuzz_one
KINDS: tuple[str, ...] = _target.KINDS

_methods = st.sampled_from([b"session/prompt", b"initialize", b"", b"_x/y"]) | st.binary(
    max_size=12
)


def _input(kind: str, flags: int, method: bytes, id_bytes: bytes) -> bytes:
    return bytes([KINDS.index(kind), flags]) + method.replace(b"\x00", b"") + b"\x00" + id_bytes


@given(
    st.sampled_from([k for k in KINDS if k != "integer"]),
    st.integers(0, 255),
    _methods,
    st.binary(max_size=64),
)
@example("fraction", 0, b"m", b"\x01\x05")
@example("exponent", 0x80, b"m", b"\x02\xbc\x01")  # 1e700 overflows a double
@example("string", 0x80, b"m", 'é\u2028"\\'.encode())
def test_ids_other_than_integers(kind: str, flags: int, method: bytes, body: bytes) -> None:
    fuzz_one(_input(kind, flags, method, body))


@given(st.integers(0, 255), _methods, st.binary(max_size=18))
@example(0x40, b"m", b"\x00")  # -0
@example(0, b"m", bytes(int(d) for d in str(2**63 - 1)))
def test_integer_ids_within_64_bits(flags: int, method: bytes, digits: bytes) -> None:
    fuzz_one(_input("integer", flags, method, digits))


def test_integer_id_beyond_64_bits_is_echoed() -> None:
    # 18446744073709551616: 2**64, the example docs/protocol.md gives.
    fuzz_one(
        _input(
            "integer", 0, b"m", bytes([1, 8, 4, 4, 6, 7, 4, 4, 0, 7, 3, 7, 0, 9, 5, 5, 1, 6, 1, 6])
        )
    )


# Up to 300 digits: beyond a double (309+) is the pending finding tested below.
@given(st.integers(0, 255), st.binary(min_size=20, max_size=300))
def test_integer_ids_of_any_length(flags: int, digits: bytes) -> None:
    fuzz_one(_input("integer", flags, b"m", b"\x01" + digits))


def test_integer_id_beyond_a_double_is_echoed() -> None:
    # Found by `nox -s fuzz -- 1000000`: 309 digits and more overflow orjson's float fallback.
    fuzz_one(_input("integer", 0, b"m", bytes([7] * 320)))


def test_fractional_id_beyond_a_double_is_an_invalid_request() -> None:
    # Found by `nox -s fuzz -- 1000000`: a fraction of ~600 digits overflowed a double, and the
    # line was answered as unparseable (-32700) instead of as a fractional id (-32600).
    # The input is kept in fuzz/seeds/fuzz_envelopes/ as well.
    fuzz_one(_input("fraction", 0, b"m", bytes([7] * 700)))
