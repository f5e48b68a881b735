"""What we emit validates against the official ACP schema, and our fields match it key for key."""

import json
import os
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from wire_types import WIRE_CLASSES

from maple_acp import wire
from maple_acp.testing import strategies as acp_st
from maple_acp.wire._naming import wire_key

# tests/conftest.py found (or fetched) the schema before collection and set the variable.
SCHEMA_DIR = Path(os.environ["ACP_SCHEMA_DIR"])

STABLE_DEFS: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.json").read_text())["$defs"]
UNSTABLE_DEFS: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.unstable.json").read_text())[
    "$defs"
]

_validators: dict[tuple[str, bool], Draft202012Validator] = {}
#: Which documents were checked against the metaschema (a few seconds each: once, not once
#: per definition).
_checked: set[bool] = set()


def validate(instance: Any, definition: str, *, unstable: bool = False) -> None:
    key = (definition, unstable)
    if key not in _validators:
        defs = UNSTABLE_DEFS if unstable else STABLE_DEFS
        if unstable not in _checked:
            Draft202012Validator.check_schema({"$defs": defs})
            _checked.add(unstable)
        if definition not in defs:
            raise KeyError(
                f"{definition} is not defined in the {'unstable' if unstable else 'stable'} schema"
            )
        _validators[key] = Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": defs})
    _validators[key].validate(instance)


def emitted(obj: Any, as_type: Any = None) -> Any:
    """What a peer receives: the encoded bytes, parsed back."""
    return orjson.loads(wire.encode(obj, as_type=as_type))


#: Schema definition of each method's params and result, where ACP defines one.
PARAMS_DEFS = {
    "initialize": "InitializeRequest",
    "session/new": "NewSessionRequest",
    "session/load": "LoadSessionRequest",
    "session/resume": "ResumeSessionRequest",
    "session/delete": "DeleteSessionRequest",
    "session/list": "ListSessionsRequest",
    "session/prompt": "PromptRequest",
    "session/cancel": "CancelNotification",
    "session/close": "CloseSessionRequest",
    "session/set_config_option": "SetSessionConfigOptionRequest",
    "session/set_mode": "SetSessionModeRequest",
    "session/update": "SessionNotification",
    "session/request_permission": "RequestPermissionRequest",
    "elicitation/create": "CreateElicitationRequest",
    "$/cancel_request": "CancelRequestNotification",
}
#: Methods only the unstable schema defines: (params, result).
UNSTABLE_DEFS_BY_METHOD = {"session/fork": ("ForkSessionRequest", "ForkSessionResponse")}
RESULT_DEFS = {
    "initialize": "InitializeResponse",
    "session/new": "NewSessionResponse",
    "session/load": "LoadSessionResponse",
    "session/resume": "ResumeSessionResponse",
    "session/delete": "DeleteSessionResponse",
    "session/list": "ListSessionsResponse",
    "session/close": "CloseSessionResponse",
    "session/set_config_option": "SetSessionConfigOptionResponse",
    "session/set_mode": "SetSessionModeResponse",
    "session/request_permission": "RequestPermissionResponse",
    "elicitation/create": "CreateElicitationResponse",
}


@given(acp_st.agent_results())
def test_every_agent_result_validates(call: tuple[str, Any]) -> None:
    method, result = call
    data = emitted(result, wire.AGENT_METHODS[method].result)
    if method == "session/prompt":
        # ``usage`` is defined only by the unstable schema; the stable one must accept it too.
        validate(data, "PromptResponse", unstable=True)
        validate(data, "PromptResponse")
    elif method in RESULT_DEFS:
        validate(data, RESULT_DEFS[method])
    elif method in UNSTABLE_DEFS_BY_METHOD:
        validate(data, UNSTABLE_DEFS_BY_METHOD[method][1], unstable=True)
    else:
        assert method in {
            "_session/background",
            "_session/goal",
            "_session/queue",
            "_session/steering",
            "_maple/status",
            "_maple/transcript",
        }
        assert isinstance(data, dict)
        if method == "_session/steering":
            assert data["outcome"] in {"injected", "startedNewTurn", "promptRequired"}
        if method == "_session/background":
            for command in data.get("commands", ()):
                assert command["status"] in {"running", "exited"}


@given(acp_st.client_requests())
def test_every_request_we_send_to_the_client_validates(call: tuple[str, Any]) -> None:
    method, params = call
    data = emitted(params, wire.CLIENT_METHODS[method].params)
    validate(data, PARAMS_DEFS[method], unstable=_plan_operation(data.get("update")))


#: Update kinds v1 1.29 defines only in its unstable file (sent to a client that declared
#: ``clientCapabilities.plan``).
_PLAN_OPERATIONS = frozenset({"plan_update", "plan_removed"})


def _plan_operation(update: Any) -> bool:
    return isinstance(update, dict) and update.get("sessionUpdate") in _PLAN_OPERATIONS


@given(acp_st.session_updates())
def test_every_session_update_variant_validates(update: wire.SessionUpdate) -> None:
    data = emitted(update, wire.SessionUpdate)
    unstable = _plan_operation(data)
    validate(data, "SessionUpdate", unstable=unstable)
    notification = wire.SessionNotification(session_id="s1", update=update)
    validate(emitted(notification), "SessionNotification", unstable=unstable)


@given(acp_st.agent_requests())
def test_agent_requests_a_client_would_send_validate(call: tuple[str, Any]) -> None:
    method, params = call
    if method in PARAMS_DEFS:
        data = emitted(params, wire.AGENT_METHODS[method].params)
        # An MCP server that lives in the client (``type: "acp"``) is the unstable schema's.
        client_side = any(
            isinstance(server, dict) and server.get("type") == "acp"
            for server in data.get("mcpServers") or ()
        )
        validate(data, PARAMS_DEFS[method], unstable=client_side)
    elif method in UNSTABLE_DEFS_BY_METHOD:
        data = emitted(params, wire.AGENT_METHODS[method].params)
        validate(data, UNSTABLE_DEFS_BY_METHOD[method][0], unstable=True)


@given(acp_st.client_results())
def test_client_answers_validate(call: tuple[str, Any]) -> None:
    method, result = call
    validate(emitted(result, wire.CLIENT_METHODS[method].result), RESULT_DEFS[method])


@given(
    st.builds(
        wire.Usage,
        **{
            name: st.integers(0, 2**63)
            for name in ("input_tokens", "output_tokens", "total_tokens")
        },
    )
)
def test_prompt_response_with_usage_validates_against_unstable(usage: wire.Usage) -> None:
    response = wire.PromptResponse(stop_reason="end_turn", usage=usage)
    validate(emitted(response), "PromptResponse", unstable=True)
    validate(emitted(usage), "Usage", unstable=True)


def test_the_initialize_response_we_advertise_validates() -> None:
    response = wire.InitializeResponse(
        protocol_version=1,
        agent_capabilities=wire.AgentCapabilities(
            load_session=True,
            prompt_capabilities=wire.PromptCapabilities(),
            mcp_capabilities=wire.McpCapabilities(http=True, sse=False),
            session_capabilities=wire.SessionCapabilities(
                list=wire.SessionListCapabilities(), close=wire.SessionCloseCapabilities()
            ),
        ),
        agent_info=wire.Implementation(name="maple-acp", version="0.1.0"),
        meta=wire.goal_capability_meta(
            wire.GoalCapability(actions=("set", "pause", "resume", "clear"))
        ),
    )
    data = emitted(response)
    validate(data, "InitializeResponse")
    assert data["_meta"]["goal"]["actions"] == ["set", "pause", "resume", "clear"]
    assert data["agentCapabilities"]["promptCapabilities"] == {
        "image": False,
        "audio": False,
        "embeddedContext": False,
    }


@given(
    st.none()
    | st.builds(
        wire.GoalSnapshot,
        objective=acp_st.texts(min_size=1),
        status=st.sampled_from(["active", "paused", "blocked", "limited", "complete"]),
        iterations=st.none() | st.integers(0, 1000),
        created_at=st.none() | st.integers(0, 2**45),
        updated_at=st.none() | st.integers(0, 2**45),
        budgets=st.none() | acp_st.json_objects(),
    )
)
def test_goal_session_info_update_validates(snapshot: wire.GoalSnapshot | None) -> None:
    update = wire.goal_info_update(snapshot, title="t")
    validate(emitted(update, wire.SessionUpdate), "SessionUpdate")


def test_trust_elicitation_validates() -> None:
    request = wire.CreateElicitationRequest(
        message="Trust this project?",
        session_id="s1",
        requested_schema=wire.ElicitationSchema(
            properties={"trust": wire.BooleanPropertySchema(title="Trust", default=False)},
            required=("trust",),
        ),
    )
    data = emitted(request)
    validate(data, "CreateElicitationRequest")
    assert data["mode"] == "form"
    assert data["requestedSchema"]["properties"]["trust"]["type"] == "boolean"


# --- field by field ------------------------------------------------------------------------------

#: Schema definitions whose properties together make up each class, when not its own name.
COMPOSED = {
    "UserMessageChunk": ["ContentChunk"],
    "AgentMessageChunk": ["ContentChunk"],
    "AgentThoughtChunk": ["ContentChunk"],
    "SessionConfigSelect": ["SessionConfigOption", "SessionConfigSelect"],
    "SessionConfigBoolean": ["SessionConfigOption", "SessionConfigBoolean"],
    "AuthMethod": ["AuthMethodAgent"],
    "ElicitationAccept": ["CreateElicitationResponse", "ElicitationAcceptAction"],
    "ElicitationDecline": ["CreateElicitationResponse"],
    "ElicitationCancel": ["CreateElicitationResponse"],
    "CreateElicitationRequest": [
        "CreateElicitationRequest",
        "ElicitationFormMode",
        "ElicitationSessionScope",
        "ElicitationRequestScope",
    ],
    "CancelledPermissionOutcome": [],
    "SetSessionConfigOptionRequest": ["SetSessionConfigOptionRequest"],
}
#: Keys a class carries beyond its definitions' properties: the tags in ``anyOf`` branches.
EXTRA_KEYS = {
    "CreateElicitationRequest": {"mode"},
    # Union members whose tag is a field of their own: this agent sends no other member.
    "BooleanPropertySchema": {"type"},
    "SessionConfigSelect": {"type"},
    "SessionConfigBoolean": {"type"},
    "SetSessionConfigOptionRequest": {"type", "value"},
    "PlanItems": {"type"},
    "PlanMarkdown": {"type"},
    # ``fork`` is the unstable schema's (checked against it by the edge's initialize test).
    "SessionCapabilities": {"fork"},
    # ``plan`` and ``subagents`` are the unstable schema's (v1 1.29); their capability
    # markers are checked below.
    "ClientCapabilities": {"plan", "subagents"},
}
#: Our own extensions, which the ACP schema does not define.
EXTENSIONS = {
    "BackgroundCommand",
    "BackgroundRequest",
    "BackgroundResponse",
    "BridgeHello",
    "GoalCapability",
    "GoalSnapshot",
    "GoalControlRequest",
    "GoalControlResponse",
    "HostStatus",
    "QueueChangedNotification",
    "QueueEntry",
    "QueueRequest",
    "QueueResponse",
    "StatusRequest",
    "SteeringRequest",
    "SteeringResponse",
    "TranscriptRequest",
    "TranscriptResponse",
}


ACP_CLASSES = [cls for cls in WIRE_CLASSES if cls.__name__ not in EXTENSIONS]


@pytest.mark.parametrize("cls", ACP_CLASSES, ids=lambda cls: cls.__name__)
def test_fields_match_the_schema_key_for_key(cls: type) -> None:
    parts = COMPOSED.get(cls.__name__, [cls.__name__])
    # ``usage`` on the prompt response is the one unstable field we emit on purpose.
    defs = {
        **STABLE_DEFS,
        "Usage": UNSTABLE_DEFS["Usage"],
        "PromptResponse": UNSTABLE_DEFS["PromptResponse"],
        # ``session/fork`` is served as the unstable schema defines it.
        **{
            name: UNSTABLE_DEFS[name]
            for name in ("ForkSessionRequest", "ForkSessionResponse", "SessionForkCapabilities")
        },
        # Plan operations, sent to a client that declared ``clientCapabilities.plan``.
        **{
            name: UNSTABLE_DEFS[name]
            for name in (
                "PlanCapabilities",
                "PlanItems",
                "PlanMarkdown",
                "PlanRemoved",
                "PlanUpdate",
            )
        },
        # MCP servers that live in the client (MCP over ACP) are the unstable schema's.
        **{name: UNSTABLE_DEFS[name] for name in ("McpCapabilities", "McpServerAcp")},
        # Child sessions, shown to a client that declared ``clientCapabilities.subagents``.
        "SubagentCapabilities": UNSTABLE_DEFS["SubagentCapabilities"],
    }
    schema_keys: set[str] = set()
    required: set[str] = set()
    for part in parts:
        schema_keys |= set(defs[part].get("properties", {}))
        required |= set(defs[part].get("required", []))
    ours = {wire_key(a.name) for a in attrs.fields(cls)}
    assert ours - EXTRA_KEYS.get(cls.__name__, set()) == schema_keys
    if len(parts) == 1 and cls.__name__ not in EXTRA_KEYS:
        mandatory = {wire_key(a.name) for a in attrs.fields(cls) if a.default is attrs.NOTHING}
        assert mandatory == required
