"""Runs the provider stream fuzz target under Hypothesis: raw event streams, and well-formed
answers whose tool-call arguments are cut anywhere."""

from __future__ import annotations

import json
from collections.abc import Callable

from fuzz_targets import load_fuzz_target
from hypothesis import example, given, settings
from hypothesis import strategies as st

_target = load_fuzz_target("fuzz_provider_stream")
fuzz_one: Callable[[bytes], None] = _target.fuzz_one

_events = st.lists(
    st.one_of(
        st.builds(
            lambda text: {"choices": [{"index": 0, "delta": {"content": text}}]},
            st.text(max_size=8),
        ),
        st.builds(
            lambda index, piece: {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [{"index": index, "function": {"arguments": piece}}]
                        },
                    }
                ]
            },
            st.integers(0, 2),
            st.text(max_size=8),
        ),
        st.fixed_dictionaries(
            {
                "choices": st.just([]),
                "usage": st.fixed_dictionaries({"prompt_tokens": st.integers(0, 99)}),
            }
        ),
        st.dictionaries(
            st.sampled_from(["choices", "usage", "error", "id"]),
            st.integers() | st.text(max_size=4) | st.none(),
            max_size=3,
        ),
    ),
    max_size=6,
)
_endings = st.sampled_from(["\n\n", "\r\n\r\n", "\r\r", "\n", "\r\n"])


@settings(max_examples=150)
@given(st.integers(0, 255), _events, _endings, st.booleans())
@example(3, [{"choices": [{"index": 0, "delta": {"content": "é"}}]}], "\r\n\r\n", True)
def test_event_streams_split_anywhere(
    chunk: int, events: list[object], ending: str, done: bool
) -> None:
    body = "".join("data: " + json.dumps(event) + ending for event in events)
    if done:
        body += "data: [DONE]" + ending
    fuzz_one(bytes([0, chunk]) + body.encode())


@settings(max_examples=150)
@given(st.binary(max_size=400))
def test_well_formed_answers_cut_anywhere(decisions: bytes) -> None:
    fuzz_one(b"\x01" + decisions)


@settings(max_examples=100)
@given(st.integers(0, 255), st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=200))
def test_ascii_event_streams(chunk: int, body: str) -> None:
    fuzz_one(bytes([0, chunk]) + body.encode())


def test_invalid_utf8_in_a_stream_is_a_malformed_stream() -> None:
    outcome = _target.assemble(b'data: {"choices":[{"delta":{"content":"caf\xe9"}}]}\n\n', 7)
    assert outcome == ("fault", "the provider sent a malformed stream")
