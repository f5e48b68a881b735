"""Fuzz target: the relay hello (``_maple/bridge/hello``), from both ends.

The first byte picks the end:

- even: the host's reading of a hello line. The rest is the line; the host parses the envelope,
  structures the params as ``BridgeHello`` and hands the offered environment to the runtime
  (``RelayValues.accept``, what ``AgentService.accept_relay`` runs), which keeps the names on
  its allow-list and checks them, as the edge does with a connection's first frame. The only
  acceptable refusals are ``ProtocolError(-32602)`` and ``RuntimeRejection(INVALID_RELAY)``,
  each a bounded single line that repeats no offered value. What is accepted holds only
  allow-listed, well-formed names, at most 16 values of at most 16 KiB each and 32 KiB in all,
  none with NUL.
- odd: the connector's building of a hello from its environment. The rest is JSON (an object
  of names to values, plus the allow-list under ``MAPLE_ACP_RELAY_ENV``); whatever the
  connector sends is one newline-terminated notification line the host accepts in full, and
  its notes for stderr name variables but never repeat a value.

Run ``python fuzz/fuzz_relay_hello.py -atheris_runs=N``; tests import :func:`fuzz_one`.
"""

from __future__ import annotations

import json
import re

import orjson

from maple_acp.rpc import InvalidMessage, Notification, parse_message
from maple_acp.runtime import (
    MAX_RELAY_TOTAL_BYTES,
    MAX_RELAY_VALUE_BYTES,
    MAX_RELAY_VALUES,
    RejectionKind,
    RelayValues,
    RuntimeRejection,
)
from maple_acp.wire import (
    INVALID_PARAMS,
    MAX_ERROR_MESSAGE_CHARS,
    BridgeHello,
    ProtocolError,
    structure_params,
)
from maple_acp_connector._hello import HELLO_METHOD, RELAY_ENV, build_hello

#: The host allow-list the target checks against (the fuzzer finds these names via the seeds).
ALLOWED = frozenset({"TOKEN", "API_KEY", "HOME_URL", "A", "_B1"})
#: Shorter values could occur in a message's fixed wording by chance.
_MIN_CHECKED_SECRET = 8
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def host_relay(line: bytes, allowed: frozenset[str]) -> dict[str, str]:
    """What a host keeps from a hello line; raises the refusal it would log."""
    parsed = parse_message(line)
    if isinstance(parsed, InvalidMessage):
        raise parsed.reply.to_exception()
    if not isinstance(parsed, Notification) or parsed.method != HELLO_METHOD:
        raise ProtocolError(INVALID_PARAMS, "not a bridge hello")
    hello = structure_params(parsed.params, BridgeHello)
    relay = RelayValues.accept(hello.environment, allowed)
    offered = hello.environment
    assert relay.dropped == sum(1 for name in offered if name not in allowed)
    return dict(relay)


def _offered_values(line: bytes) -> list[str]:
    try:
        document = json.loads(line)
    except (ValueError, RecursionError):
        return []
    params = document.get("params") if isinstance(document, dict) else None
    environment = params.get("environment") if isinstance(params, dict) else None
    if not isinstance(environment, dict):
        return []
    return [v for v in environment.values() if isinstance(v, str)]


def _check_message(message: str, secrets: list[str]) -> None:
    assert message
    assert "\n" not in message
    assert len(message) <= MAX_ERROR_MESSAGE_CHARS
    for secret in secrets:
        if len(secret) >= _MIN_CHECKED_SECRET:
            assert secret not in message, "a refusal repeated a relay value"


def _check_accepted(relay: dict[str, str], allowed: frozenset[str]) -> None:
    assert len(relay) <= MAX_RELAY_VALUES
    total = 0
    for name, value in relay.items():
        assert name in allowed
        assert _NAME.match(name)
        assert isinstance(value, str)
        assert "\x00" not in value
        size = len(value.encode("utf-8", "surrogatepass"))
        assert size <= MAX_RELAY_VALUE_BYTES
        total += size
    assert total <= MAX_RELAY_TOTAL_BYTES


def _host_side(line: bytes) -> None:
    secrets = _offered_values(line)
    try:
        relay = host_relay(line, ALLOWED)
    except ProtocolError as error:
        _check_message(error.message, secrets)
        return
    except RuntimeRejection as rejection:
        assert rejection.kind is RejectionKind.INVALID_RELAY  # noqa: PT017
        _check_message(rejection.message, secrets)
        return
    _check_accepted(relay, ALLOWED)


def _environment(body: bytes) -> dict[str, str]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        # Raw bytes: one allow-listed variable holding them, however malformed.
        text = body.decode("utf-8", "surrogateescape")
        return {RELAY_ENV: "TOKEN", "TOKEN": text}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, str)}


def _connector_side(body: bytes) -> None:
    env = _environment(body)
    line, notes = build_hello(env)
    # A note may name a variable; a value that happens to be part of the allow-list's own
    # text is not leaked by naming it.
    shown = env.get(RELAY_ENV, "")
    values = [v for k, v in env.items() if k != RELAY_ENV and v not in shown]
    for note in notes:
        _check_message(note, values)
    if line is None:
        return
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    names = {name.strip() for name in env.get(RELAY_ENV, "").split(",")}
    allowed = frozenset(name for name in names if _NAME.match(name))
    relay = host_relay(line[:-1], allowed)
    sent = json.loads(line)["params"]["environment"]
    assert relay == sent, "the host refused part of what the connector sent"
    for name, value in sent.items():
        assert env[name] == value


def fuzz_one(data: bytes) -> None:
    """Check the invariants above on one input. Raises AssertionError on a violation."""
    if not data:
        return
    if data[0] % 2 == 0:
        _host_side(data[1:])
    else:
        _connector_side(data[1:])


def main() -> None:
    from _atheris import run

    modules = [
        "maple_acp.runtime._relay",
        "maple_acp.rpc._envelope",
        "maple_acp.wire._converter",
        "maple_acp_connector._hello",
        __name__,
    ]
    run("fuzz_relay_hello", fuzz_one, modules)


if __name__ == "__main__":
    main()
