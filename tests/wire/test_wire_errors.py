"""Bad params become one bounded -32602 line that names the failing field."""

from typing import Any

import pytest

from maple_acp import wire

PROMPT = {"sessionId": "s1", "prompt": [{"type": "text", "text": "hi"}]}


def rejection(params: Any, cls: Any) -> str:
    with pytest.raises(wire.ProtocolError) as caught:
        wire.structure_params(params, cls)
    error = caught.value
    assert error.code == wire.INVALID_PARAMS
    assert "\n" not in error.message
    assert 0 < len(error.message) <= wire.MAX_ERROR_MESSAGE_CHARS
    return error.message


@pytest.mark.parametrize(
    ("params", "kind"),
    [([], "an array"), ("x", "a string"), (3, "a number"), (True, "a boolean")],
)
def test_params_must_be_an_object(params: Any, kind: str) -> None:
    assert rejection(params, wire.PromptRequest) == (
        f"invalid params: expected an object, got {kind}"
    )


@pytest.mark.parametrize(
    ("cls", "params", "message"),
    [
        (
            wire.PromptRequest,
            {"prompt": []},
            "invalid params: sessionId: missing required field",
        ),
        (
            wire.NewSessionRequest,
            {"cwd": "/p"},
            "invalid params: mcpServers: missing required field",
        ),
        (
            wire.PromptRequest,
            {"sessionId": "s", "prompt": [{"type": "text"}]},
            "invalid params: prompt[0].text: missing required field",
        ),
        (
            wire.InitializeRequest,
            {},
            "invalid params: protocolVersion: missing required field",
        ),
        (
            wire.RequestPermissionResponse,
            {"outcome": {"outcome": "selected"}},
            "invalid params: outcome.optionId: missing required field",
        ),
    ],
)
def test_missing_required_fields_are_named(cls: Any, params: Any, message: str) -> None:
    assert rejection(params, cls) == message


def test_every_missing_field_is_counted() -> None:
    assert rejection({}, wire.LoadSessionRequest) == (
        "invalid params: sessionId: missing required field (and 2 more errors)"
    )


@pytest.mark.parametrize(
    ("cls", "params", "message"),
    [
        (
            wire.PromptRequest,
            {"sessionId": 5, "prompt": []},
            "invalid params: sessionId: expected a string, got a number",
        ),
        (
            wire.PromptRequest,
            {"sessionId": "s", "prompt": {"type": "text"}},
            "invalid params: prompt: expected an array, got an object",
        ),
        (
            wire.PromptRequest,
            {"sessionId": "s", "prompt": ["hi"]},
            "invalid params: prompt[0]: expected an object, got a string",
        ),
        (
            wire.InitializeRequest,
            {"protocolVersion": True},
            "invalid params: protocolVersion: expected an integer, got a boolean",
        ),
        (
            wire.InitializeRequest,
            {"protocolVersion": 1 << 20},
            "invalid params: protocolVersion: expected an integer from 0 to 65535",
        ),
        (
            wire.NewSessionRequest,
            {
                "cwd": "/p",
                "mcpServers": [
                    {
                        "type": "http",
                        "name": "h",
                        "url": "u",
                        "headers": [{"name": "a", "value": 1}],
                    }
                ],
            },
            "invalid params: mcpServers[0].headers[0].value: expected a string, got a number",
        ),
        (
            wire.SetSessionConfigOptionRequest,
            {"sessionId": "s", "configId": "c", "value": True},
            "invalid params: value: 'c' was given a value that is not a string "
            "(a boolean needs type 'boolean')",
        ),
        (
            wire.GoalControlRequest,
            {"sessionId": "s", "action": "restart"},
            "invalid params: action: expected one of 'set', 'pause', 'resume', 'clear'",
        ),
        (
            wire.BridgeHello,
            {"environment": {"PATH": ["/bin"]}},
            "invalid params: environment.PATH: expected a string, got an array",
        ),
        (
            wire.SetSessionConfigOptionRequest,
            {"sessionId": "s", "configId": "c", "value": 1.5},
            "invalid params: value: expected a string or a boolean, got a number",
        ),
        (
            wire.CancelRequestNotification,
            {"requestId": 1.5},
            "invalid params: requestId: expected an integer, a string or null, got a number",
        ),
    ],
)
def test_wrong_types_are_named(cls: Any, params: Any, message: str) -> None:
    assert rejection(params, cls) == message


@pytest.mark.parametrize(
    ("cls", "params", "message"),
    [
        (
            wire.PromptRequest,
            {"sessionId": "s", "prompt": [{"type": "text", "text": "a"}] * 2 + [{"type": "video"}]},
            "invalid params: prompt[2].type: unknown content block type 'video'",
        ),
        (
            wire.SessionNotification,
            {"sessionId": "s", "update": {"sessionUpdate": "telepathy"}},
            "invalid params: update.sessionUpdate: unknown session update 'telepathy'",
        ),
        (
            wire.NewSessionRequest,
            {"cwd": "/p", "mcpServers": [{"type": "websocket", "name": "w"}]},
            "invalid params: mcpServers[0].type: unknown MCP server type 'websocket'",
        ),
        (
            wire.RequestPermissionResponse,
            {"outcome": {"outcome": "maybe"}},
            "invalid params: outcome.outcome: unknown permission outcome 'maybe'",
        ),
        (
            wire.CreateElicitationResponse,
            {"action": "shrug"},
            "invalid params: action: unknown elicitation action 'shrug'",
        ),
        (
            wire.PromptRequest,
            {"sessionId": "s", "prompt": [{"text": "no tag"}]},
            "invalid params: prompt[0].type: missing required field",
        ),
        (
            wire.PromptRequest,
            {"sessionId": "s", "prompt": [{"type": 7}]},
            "invalid params: prompt[0].type: expected a string, got a number",
        ),
    ],
)
def test_unknown_tags_are_named(cls: Any, params: Any, message: str) -> None:
    assert rejection(params, cls) == message


def test_a_long_unknown_tag_is_cut_short() -> None:
    tag = "v" * 10_000
    message = rejection({"sessionId": "s", "prompt": [{"type": tag}]}, wire.PromptRequest)
    assert message.startswith("invalid params: prompt[0].type: unknown content block type 'vvv")
    assert len(message) < 120


def test_a_long_map_key_is_cut_short_and_control_characters_removed() -> None:
    key = "K\n" * 5_000
    message = rejection({"environment": {key: 1}}, wire.BridgeHello)
    assert "\n" not in message
    assert len(message) < 150


def test_values_are_never_quoted_back() -> None:
    secret = "Bearer super-secret-token"
    params = {
        "cwd": "/p",
        "mcpServers": [
            {
                "type": "http",
                "name": "h",
                "url": "u",
                "headers": [{"name": "Authorization", "value": [secret]}],
            }
        ],
    }
    assert secret not in rejection(params, wire.NewSessionRequest)


def test_the_converter_is_still_usable_after_a_rejection() -> None:
    rejection({"sessionId": 1}, wire.PromptRequest)
    assert wire.structure_params(PROMPT, wire.PromptRequest).session_id == "s1"
