"""Fuzz target: arbitrary bytes as the params (and results) of every ACP method we know.

Input is parsed with orjson; every JSON value is then structured as each method's params and
result type. The only acceptable failure is ``ProtocolError(-32602)`` with a one-line bounded
message; anything else escaping is a crash. A value that is accepted must survive being written
back and read again unchanged.

Run ``python fuzz/fuzz_params.py -atheris_runs=N``; tests import :func:`fuzz_one` directly.
"""

import sys
import tempfile
from pathlib import Path
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


#: Valid documents the fuzzer starts from: random bytes alone rarely form a JSON object with
#: the right keys, so without them it would mostly exercise the JSON parser.
SEEDS: tuple[dict[str, Any], ...] = (
    {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True}, "elicitation": {"form": {}}},
        "clientInfo": {"name": "c", "version": "1"},
    },
    {
        "cwd": "/p",
        "mcpServers": [
            {
                "type": "http",
                "name": "h",
                "url": "http://127.0.0.1/",
                "headers": [{"name": "a", "value": "b"}],
            },
            {"name": "s", "command": "c", "args": ["x"], "env": [{"name": "E", "value": "v"}]},
        ],
    },
    {
        "sessionId": "s",
        "cwd": "/p",
        "mcpServers": [{"type": "sse", "name": "e", "url": "u", "headers": []}],
        "additionalDirectories": ["/q"],
    },
    {"cwd": "/p", "cursor": "10", "_meta": {"k": [1, 2.5, None]}},
    {
        "sessionId": "s",
        "prompt": [
            {"type": "text", "text": "hi"},
            {"type": "resource_link", "name": "n", "uri": "file:///a", "size": 3},
            {"type": "image", "data": "AA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "u", "text": "t"}},
            {"type": "audio", "data": "AA", "mimeType": "audio/wav"},
        ],
    },
    {"sessionId": "s", "configId": "model", "value": "m"},
    {"sessionId": "s", "configId": "flag", "type": "boolean", "value": True},
    {"sessionId": "s", "modeId": "interactive"},
    {"sessionId": "s", "action": "set", "objective": "ship it"},
    {"environment": {"PATH": "/bin"}},
    {"requestId": 7},
    {
        "sessionId": "s",
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "x"},
            "messageId": "m",
        },
    },
    {
        "sessionId": "s",
        "update": {
            "sessionUpdate": "tool_call",
            "toolCallId": "t",
            "title": "ls",
            "kind": "execute",
            "status": "pending",
            "content": [{"type": "diff", "path": "/a", "newText": "n"}],
            "locations": [{"path": "/a", "line": 1}],
            "rawInput": {"a": 1},
        },
    },
    {
        "sessionId": "s",
        "update": {
            "sessionUpdate": "config_option_update",
            "configOptions": [
                {
                    "type": "select",
                    "id": "model",
                    "name": "Model",
                    "currentValue": "a",
                    "category": "model",
                    "options": [{"value": "a", "name": "A"}],
                }
            ],
        },
    },
    {
        "sessionId": "s",
        "update": {
            "sessionUpdate": "usage_update",
            "used": 1,
            "size": 2,
            "cost": {"amount": 0.5, "currency": "USD"},
        },
    },
    {
        "sessionId": "s",
        "toolCall": {"toolCallId": "t"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}],
    },
    {"outcome": {"outcome": "selected", "optionId": "allow"}},
    {
        "mode": "form",
        "message": "Trust?",
        "sessionId": "s",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "trust": {"type": "boolean", "default": False},
                "tags": {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"}]}},
            },
            "required": ["trust"],
        },
    },
    {"action": "accept", "content": {"trust": True, "n": 2, "tags": ["a"]}},
    {"stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}},
)


def _corpus_arguments() -> list[str]:
    """A seed corpus directory and a token dictionary, unless a corpus was given."""
    if any(not arg.startswith("-") for arg in sys.argv[1:]):
        return []
    work = Path(tempfile.mkdtemp(prefix="fuzz_params_"))
    corpus = work / "corpus"
    corpus.mkdir()
    tokens: set[str] = set()
    for index, seed in enumerate(SEEDS):
        (corpus / f"seed{index:02d}.json").write_bytes(orjson.dumps(seed))
        _collect_tokens(seed, tokens)
    dictionary = work / "tokens.dict"
    # libFuzzer's dictionary syntax: one quoted token per line, with \\ and \" escaped.
    lines = []
    for token in sorted(tokens):
        quoted = orjson.dumps(token).decode().replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'"{quoted}"\n')
    dictionary.write_text("".join(lines))
    return [str(corpus), f"-dict={dictionary}"]


def _collect_tokens(value: object, tokens: set[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            tokens.add(key)
            _collect_tokens(item, tokens)
    elif isinstance(value, list):
        for item in value:
            _collect_tokens(item, tokens)
    elif isinstance(value, str):
        tokens.add(value)


def main() -> None:
    try:
        import atheris  # type: ignore[import-untyped]
    except ImportError:
        sys.exit("atheris is not installed; the tests drive fuzz_one through Hypothesis instead")
    # The wire package is already imported: instrument what is loaded for coverage feedback.
    atheris.instrument_all()
    atheris.Setup([*sys.argv, *_corpus_arguments()], fuzz_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
