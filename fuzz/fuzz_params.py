"""Fuzz target: arbitrary bytes as the params (and results) of every ACP method we know.

Input is parsed with orjson; every JSON value is then structured as each method's params and
result type, taken from wire's method tables (``AGENT_METHODS`` and the others), so a method
added there is fuzzed without a change here. The seed corpus (``fuzz/seeds/fuzz_params/``)
holds a valid document for every method: random bytes alone rarely form a JSON object with the
right keys, so without them the fuzzer would mostly exercise the JSON parser.

The only acceptable failure is ``ProtocolError(-32602)`` with a one-line bounded message;
anything else escaping is a crash. A value that is accepted must survive being written back and
read again unchanged.

Run ``python fuzz/fuzz_params.py -atheris_runs=N``; tests import :func:`fuzz_one` directly.
"""

from typing import Any

import orjson

from maple_acp.wire import (
    AGENT_METHODS,
    CLIENT_METHODS,
    INVALID_PARAMS,
    MAX_ERROR_MESSAGE_CHARS,
    PROTOCOL_METHODS,
    ProtocolError,
    encode,
    structure_params,
)

TARGET_TYPES: tuple[Any, ...] = tuple(
    tp
    for table in (AGENT_METHODS, CLIENT_METHODS, PROTOCOL_METHODS)
    for spec in table.values()
    for tp in (spec.params, spec.result)
    if tp is not None
)


def _check_rejection(error: ProtocolError) -> None:
    if error.code != INVALID_PARAMS:
        raise AssertionError(f"unexpected code {error.code}")
    message = error.message
    if not message or "\n" in message or len(message) > MAX_ERROR_MESSAGE_CHARS:
        raise AssertionError(f"malformed error message {message!r}")


def fuzz_one(data: bytes) -> None:
    """Structure ``data`` as every known params/result type; raise only on a real defect."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    for tp in TARGET_TYPES:
        try:
            obj = structure_params(value, tp)
        except ProtocolError as error:
            _check_rejection(error)
            continue
        again = structure_params(orjson.loads(encode(obj, as_type=tp)), tp)
        if again != obj:
            raise AssertionError(f"{tp!r} changed in a round trip: {obj!r} -> {again!r}")


def main() -> None:
    from _atheris import run

    # The wire package is already imported: instrument what is loaded for coverage feedback.
    run("fuzz_params", fuzz_one)


if __name__ == "__main__":
    main()
