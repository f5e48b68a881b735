"""Every wire type survives unstructure -> JSON -> structure unchanged, and the wire rules hold."""

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_types import WIRE_CLASSES, WIRE_UNIONS

from maple_acp import wire
from maple_acp.testing import strategies as acp_st

#: A tenth of the profile's examples for each of the ~100 per-type tests keeps the directory fast;
#: the union and method-table tests below draw the same types at full count.
PER_TYPE = settings(max_examples=max(10, settings().max_examples // 10))


def _round_trip(obj: Any, tp: Any) -> Any:
    data = orjson.loads(wire.encode(obj, as_type=tp))
    return wire.structure_params(data, tp)


@pytest.mark.parametrize("cls", WIRE_CLASSES, ids=lambda cls: cls.__name__)
@PER_TYPE
@given(data=st.data())
def test_every_class_round_trips(cls: type[Any], data: st.DataObject) -> None:
    obj = data.draw(acp_st.strategy_for(cls))
    assert wire.structure_params(wire.unstructure(obj), cls) == obj
    assert _round_trip(obj, cls) == obj


@pytest.mark.parametrize("name", sorted(WIRE_UNIONS))
@given(data=st.data())
def test_every_union_round_trips_with_its_tag(name: str, data: st.DataObject) -> None:
    union = WIRE_UNIONS[name]
    obj = data.draw(acp_st.strategy_for(union))
    assert _round_trip(obj, union) == obj
    assert type(_round_trip(obj, union)) is type(obj)


@given(acp_st.agent_requests())
def test_agent_requests_round_trip_through_the_method_table(call: tuple[str, Any]) -> None:
    method, params = call
    assert _round_trip(params, wire.AGENT_METHODS[method].params) == params


@given(acp_st.client_results())
def test_client_results_round_trip_through_the_method_table(call: tuple[str, Any]) -> None:
    method, result = call
    assert _round_trip(result, wire.CLIENT_METHODS[method].result) == result


@given(acp_st.session_notifications())
def test_none_is_never_emitted(notification: wire.SessionNotification) -> None:
    def walk(value: Any, in_meta: bool) -> None:
        if isinstance(value, dict):
            is_diff = value.get("type") == "diff"
            for key, item in value.items():
                # Inside _meta and raw tool payloads nulls are data, carried as they are; a
                # diff's oldText is null on purpose for a new file (clients need the key).
                if not in_meta and not (is_diff and key == "oldText"):
                    assert item is not None, key
                walk(item, in_meta or key in ("_meta", "rawInput", "rawOutput"))
        elif isinstance(value, list):
            for item in value:
                walk(item, in_meta)

    walk(wire.unstructure(notification), in_meta=False)


def test_keys_are_camel_case_and_meta_is_underscored() -> None:
    response = wire.NewSessionResponse(
        session_id="s1",
        modes=wire.SessionModeState(
            current_mode_id="interactive",
            available_modes=(wire.SessionMode(id="interactive", name="Interactive"),),
        ),
        meta={"k": 1},
    )
    assert wire.unstructure(response) == {
        "sessionId": "s1",
        "modes": {
            "currentModeId": "interactive",
            "availableModes": [{"id": "interactive", "name": "Interactive"}],
        },
        "_meta": {"k": 1},
    }


def test_false_capabilities_are_written_not_dropped() -> None:
    caps = wire.unstructure(wire.PromptCapabilities())
    assert caps == {"image": False, "audio": False, "embeddedContext": False}


def test_unknown_fields_are_ignored_and_never_echoed() -> None:
    params = {
        "sessionId": "s1",
        "prompt": [{"type": "text", "text": "hi", "secret": "x", "_meta": {"a": 1}}],
        "authorization": "Bearer abc",
    }
    request = wire.structure_params(params, wire.PromptRequest)
    assert request == wire.PromptRequest(
        session_id="s1", prompt=(wire.TextContent(text="hi", meta={"a": 1}),)
    )
    emitted = wire.encode(request)
    assert b"secret" not in emitted
    assert b"authorization" not in emitted
    assert b"Bearer" not in emitted


def test_meta_survives_byte_for_byte() -> None:
    meta = b'{"z":1,"a":[null,1.5,{"nested":true}],"\\u00e9t\\u00e9":"x","empty":{}}'
    line = b'{"sessionId":"s1","_meta":' + meta + b"}"
    request = wire.structure_params(orjson.loads(line), wire.CloseSessionRequest)
    assert request.meta is not None
    assert orjson.dumps(request.meta) == orjson.dumps(orjson.loads(meta))
    # Key order, nulls, nesting and non-ASCII keys come back exactly as they were sent.
    assert wire.encode(request) == orjson.dumps(orjson.loads(line))


@given(acp_st.json_objects())
def test_any_meta_object_is_carried_untouched(meta: dict[str, Any]) -> None:
    update = wire.SessionInfoUpdate(title="t", meta=meta)
    notification = wire.SessionNotification(session_id="s", update=update)
    encoded = wire.encode(notification)
    assert orjson.loads(encoded)["update"]["_meta"] == meta
    again = wire.structure_params(orjson.loads(encoded), wire.SessionNotification)
    assert again == notification


def test_stdio_mcp_server_has_no_type_and_accepts_an_explicit_one() -> None:
    stdio = wire.McpServerStdio(name="s", command="/bin/x", args=("-v",), env=())
    assert "type" not in wire.unstructure(stdio, as_type=wire.McpServer)
    explicit = {"type": "stdio", "name": "s", "command": "/bin/x", "args": ["-v"], "env": []}
    assert wire.structure_params(explicit, wire.McpServerStdio) == stdio
    params = {"cwd": "/p", "mcpServers": [explicit]}
    assert wire.structure_params(params, wire.NewSessionRequest).mcp_servers == (stdio,)


@pytest.mark.parametrize(
    ("server", "cls"),
    [
        ({"type": "http", "name": "h", "url": "http://127.0.0.1/", "headers": []}, "McpServerHttp"),
        ({"type": "sse", "name": "e", "url": "http://127.0.0.1/", "headers": []}, "McpServerSse"),
        ({"name": "s", "command": "c", "args": [], "env": []}, "McpServerStdio"),
    ],
)
def test_all_three_mcp_transports_parse(server: dict[str, Any], cls: str) -> None:
    request = wire.structure_params({"cwd": "/p", "mcpServers": [server]}, wire.NewSessionRequest)
    assert type(request.mcp_servers[0]).__name__ == cls


def test_goal_snapshot_and_clear_travel_in_session_info_meta() -> None:
    snapshot = wire.GoalSnapshot(
        objective="Ship",
        status="active",
        iterations=3,
        last_reason="tests",
        created_at=1710000000123,
        control_method=wire.GOAL_CONTROL_METHOD,
    )
    update = wire.unstructure(wire.goal_info_update(snapshot))
    assert update == {
        "_meta": {
            "goal": {
                "objective": "Ship",
                "status": "active",
                "iterations": 3,
                "lastReason": "tests",
                "createdAt": 1710000000123,
                "controlMethod": "_session/goal",
            }
        }
    }
    # Clearing publishes an explicit null inside _meta, where null is data.
    assert wire.unstructure(wire.goal_info_update(None)) == {"_meta": {"goal": None}}


def test_goal_capability_lists_only_the_given_actions() -> None:
    meta = wire.goal_capability_meta(wire.GoalCapability(actions=("set", "clear")))
    assert meta == {
        "goal": {"version": 1, "controlMethod": "_session/goal", "actions": ["set", "clear"]}
    }


def test_client_capabilities_fall_back_to_defaults_when_malformed() -> None:
    # The schema marks these default-on-error: a sloppy client still gets through initialize.
    params = {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": 5, "terminal": "yes", "elicitation": {"form": {}}},
        "clientInfo": ["not", "an", "object"],
        "_meta": "not an object",
    }
    request = wire.structure_params(params, wire.InitializeRequest)
    assert request.client_capabilities.fs == wire.FileSystemCapabilities()
    assert request.client_capabilities.terminal is False
    assert request.client_capabilities.elicitation == wire.ElicitationCapabilities(
        form=wire.ElicitationFormCapabilities()
    )
    assert request.client_info is None
    assert request.meta is None


@pytest.mark.parametrize(
    ("session", "notices", "compaction"),
    [
        ({"notices": {}, "compaction": {}}, True, True),
        ({"notices": {"future": 1}}, True, False),
        ({"notices": 5, "compaction": [1]}, False, False),
        ({"notices": None, "compaction": "yes"}, False, False),
        ({}, False, False),
    ],
)
def test_session_opt_ins_are_objects_and_lenient(
    session: dict[str, object], notices: bool, compaction: bool
) -> None:
    # 1.29 opt-ins: {} means "yes"; anything malformed means "not advertised", never an error.
    params = {"protocolVersion": 1, "clientCapabilities": {"session": session}}
    caps = wire.structure_params(params, wire.InitializeRequest).client_capabilities.session
    assert (caps.notices is not None) is notices
    assert (caps.compaction is not None) is compaction


def test_absent_params_count_as_an_empty_object() -> None:
    assert wire.structure_params(None, wire.ListSessionsRequest) == wire.ListSessionsRequest()


def test_method_tables_cover_the_protocol_surface() -> None:
    assert set(wire.AGENT_METHODS) == {
        "initialize",
        "session/new",
        "session/load",
        "session/fork",
        "session/resume",
        "session/delete",
        "session/list",
        "session/prompt",
        "session/cancel",
        "session/close",
        "session/set_config_option",
        "session/set_mode",
        "_session/goal",
        "_session/steering",
        "_session/background",
        "_session/queue",
        "_maple/status",
        "_maple/transcript",
        "_maple/bridge/hello",
    }
    assert set(wire.CLIENT_METHODS) == {
        "session/update",
        "session/request_permission",
        "elicitation/create",
    }
    assert set(wire.PROTOCOL_METHODS) == {"$/cancel_request"}
    notifications = {
        name
        for table in (wire.AGENT_METHODS, wire.CLIENT_METHODS, wire.PROTOCOL_METHODS)
        for name, spec in table.items()
        if spec.is_notification
    }
    assert notifications == {
        "session/cancel",
        "_maple/bridge/hello",
        "session/update",
        "$/cancel_request",
    }
