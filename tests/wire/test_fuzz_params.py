"""The params fuzz target's entry point, driven by Hypothesis so a crash fails the suite."""

from typing import Any

import orjson
import pytest
from fuzz_targets import FUZZ_DIR, load_fuzz_target
from hypothesis import given
from hypothesis import strategies as st

from maple_acp import wire
from maple_acp.testing import strategies as acp_st

fuzz_params = load_fuzz_target("fuzz_params")


@given(st.binary(max_size=512))
def test_arbitrary_bytes(data: bytes) -> None:
    fuzz_params.fuzz_one(data)


@given(acp_st.json_values())
def test_arbitrary_json(value: Any) -> None:
    fuzz_params.fuzz_one(orjson.dumps(value))


def _valid_documents() -> st.SearchStrategy[Any]:
    calls = acp_st.agent_requests() | acp_st.client_requests() | acp_st.client_results()
    return calls.map(lambda call: wire.unstructure(call[1]))


@st.composite
def _damaged_documents(draw: st.DrawFn) -> Any:
    """A valid message with one key dropped or one value replaced, somewhere inside it."""
    document = draw(_valid_documents())
    holders: list[Any] = []

    def collect(node: Any) -> None:
        if isinstance(node, dict) and node:
            holders.append(node)
            for item in node.values():
                collect(item)
        elif isinstance(node, list) and node:
            holders.append(node)
            for item in node:
                collect(item)

    collect(document)
    if holders:
        holder = draw(st.sampled_from(holders))
        position = draw(
            st.sampled_from(sorted(holder) if isinstance(holder, dict) else range(len(holder)))
        )
        if draw(st.booleans()) and isinstance(holder, dict):
            del holder[position]
        else:
            holder[position] = draw(acp_st.json_values())
    return document


@given(_valid_documents())
def test_valid_messages(document: Any) -> None:
    fuzz_params.fuzz_one(orjson.dumps(document))


@given(_damaged_documents())
def test_damaged_messages(document: Any) -> None:
    fuzz_params.fuzz_one(orjson.dumps(document))


def test_target_covers_every_method() -> None:
    expected = {
        tp
        for table in (wire.AGENT_METHODS, wire.CLIENT_METHODS, wire.PROTOCOL_METHODS)
        for spec in table.values()
        for tp in (spec.params, spec.result)
        if tp is not None
    }
    assert set(fuzz_params.TARGET_TYPES) == expected


def _corpus_documents() -> list[Any]:
    documents = []
    for path in sorted((FUZZ_DIR / "seeds" / "fuzz_params").glob("*.json")):
        documents.append(orjson.loads(path.read_bytes()))
    return documents


def _accepts(tp: Any, document: Any) -> bool:
    try:
        wire.structure_params(document, tp)
    except wire.ProtocolError:
        return False
    return True


def test_seeds_are_accepted_by_some_method() -> None:
    # A seed no type accepts would start the fuzzer in the JSON parser instead of the converter.
    documents = _corpus_documents()
    assert documents
    for document in documents:
        assert any(_accepts(tp, document) for tp in fuzz_params.TARGET_TYPES), document


@pytest.mark.parametrize("method", sorted(wire.AGENT_METHODS))
def test_every_agent_method_has_a_seed(method: str) -> None:
    # A method added to the registry is fuzzed at once; this asks for a seed that reaches it.
    params = wire.AGENT_METHODS[method].params
    assert any(_accepts(params, document) for document in _corpus_documents()), (
        f"add a valid {method} params document to fuzz/seeds/fuzz_params/"
    )
