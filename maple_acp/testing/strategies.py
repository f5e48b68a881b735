"""Hypothesis strategies that build valid ACP wire messages.

Every value drawn is a valid instance of its :mod:`maple_acp.wire` type: it survives
``unstructure`` → JSON → ``structure_params`` unchanged and validates against the official ACP
schema. Use them to drive a host integration with arbitrary but well-formed client traffic::

    from hypothesis import given
    from maple_acp import wire
    from maple_acp.testing import strategies as acp_st

    @given(acp_st.content_blocks())
    def test_prompt_blocks_parse(block):
        params = wire.unstructure(wire.PromptRequest(session_id="s", prompt=(block,)))
        assert wire.structure_params(params, wire.PromptRequest).prompt == (block,)

    @given(acp_st.agent_requests())
    def test_any_request(call):
        method, params = call          # e.g. ("session/prompt", PromptRequest(...))

``strategy_for(T)`` gives the strategy for any wire type ``T`` (a class or a union alias such
as ``wire.SessionUpdate``); the named functions below cover the groups tests usually want.
"""

import functools
import types
import typing
from typing import Any, Literal

import attrs
from hypothesis import strategies as st

from maple_acp import wire

__all__ = [
    "agent_requests",
    "agent_results",
    "client_requests",
    "client_results",
    "content_blocks",
    "json_objects",
    "json_values",
    "mcp_servers",
    "session_notifications",
    "session_updates",
    "strategy_for",
    "text_blocks",
    "texts",
]

#: Small collections keep examples fast while still covering empty, one and many.
_MAX_ITEMS = 3


def texts(*, min_size: int = 0, max_size: int = 24) -> st.SearchStrategy[str]:
    """Strings JSON can carry (no lone surrogates)."""
    return st.text(st.characters(codec="utf-8"), min_size=min_size, max_size=max_size)


_json_scalars: st.SearchStrategy[Any] = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts()
)


def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value, small and shallow."""
    return st.recursive(
        _json_scalars,
        lambda inner: (
            st.lists(inner, max_size=_MAX_ITEMS)
            | st.dictionaries(texts(max_size=8), inner, max_size=_MAX_ITEMS)
        ),
        max_leaves=8,
    )


def json_objects() -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object, as ``_meta`` and other open slots carry."""
    return st.dictionaries(texts(max_size=8), json_values(), max_size=_MAX_ITEMS)


def _system_prompts() -> st.SearchStrategy[dict[str, Any]]:
    # The unstable schema's ``SystemPrompt``: a mode and at least one text block.
    return st.fixed_dictionaries(
        {
            "mode": st.sampled_from(["append", "override"]),
            "content": st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": texts()}),
                min_size=1,
                max_size=3,
            ),
        }
    )


# Fields whose schema says more than their Python type: integers with another bound than the
# default 0..2**32, objects typed loosely on our side but shaped by the schema.
_FIELDS: dict[tuple[type, str], st.SearchStrategy[Any]] = {
    (wire.InitializeRequest, "protocol_version"): st.integers(0, 0xFFFF),
    (wire.InitializeResponse, "protocol_version"): st.integers(0, 0xFFFF),
    (wire.ForkSessionRequest, "system_prompt"): _system_prompts(),
}


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """Valid values of the wire type ``tp``: a wire class, a union alias or a field type."""
    return _strategy_for(tp)


@functools.cache
def _strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    special = _SPECIAL.get(tp)
    if special is not None:
        built: st.SearchStrategy[Any] = special()
        return built
    if isinstance(tp, type) and attrs.has(tp):
        return _build_class(tp)
    if tp is str:
        return texts()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(0, 2**32)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp is Any:
        return json_values()
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if _is_union(tp):
        return st.one_of([st.none() if a is type(None) else strategy_for(a) for a in args])
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(strategy_for(args[0]), max_size=_MAX_ITEMS).map(tuple)
    if origin is dict and args == (str, Any):
        return json_objects()
    if origin is dict and args[0] is str:
        return st.dictionaries(texts(max_size=12), strategy_for(args[1]), max_size=_MAX_ITEMS)
    raise TypeError(f"no strategy for wire type {tp!r}")


def _build_class(cls: Any) -> st.SearchStrategy[Any]:
    fields = {}
    for a in attrs.fields(cls):
        bounded = _FIELDS.get((cls, a.name))
        if bounded is None:
            fields[a.name] = strategy_for(a.type)
        elif _is_union(a.type):
            fields[a.name] = st.none() | bounded
        else:
            fields[a.name] = bounded
    return st.builds(cls, **fields)


def _set_config_option_requests() -> st.SearchStrategy[wire.SetSessionConfigOptionRequest]:
    # A boolean value travels with ``type: "boolean"``, a select value without a type.
    return st.one_of(
        st.builds(
            wire.SetSessionConfigOptionRequest,
            session_id=texts(),
            config_id=texts(),
            type=st.just("boolean"),
            value=st.booleans(),
            meta=st.none() | json_objects(),
        ),
        st.builds(
            wire.SetSessionConfigOptionRequest,
            session_id=texts(),
            config_id=texts(),
            value=texts(),
            meta=st.none() | json_objects(),
        ),
    )


def _elicitation_requests() -> st.SearchStrategy[wire.CreateElicitationRequest]:
    # Scoped to a session (maybe a tool call of it) or to one request.
    common = {
        "message": texts(),
        "requested_schema": strategy_for(wire.ElicitationSchema),
        "meta": st.none() | json_objects(),
    }
    return st.one_of(
        st.builds(
            wire.CreateElicitationRequest,
            session_id=texts(),
            tool_call_id=st.none() | texts(),
            **common,
        ),
        st.builds(
            wire.CreateElicitationRequest,
            request_id=st.integers(0, 2**53) | texts(),
            **common,
        ),
    )


def _content_values() -> st.SearchStrategy[wire.ElicitationContentValue]:
    return st.one_of(
        texts(),
        st.booleans(),
        st.integers(-(2**53), 2**53),
        st.floats(allow_nan=False, allow_infinity=False),
        st.lists(texts(), max_size=_MAX_ITEMS).map(tuple),
    )


def _request_ids() -> st.SearchStrategy[int | str | None]:
    return st.none() | st.integers(-(2**53), 2**53) | texts()


def _notices() -> st.SearchStrategy[wire.Notice]:
    # The schema requires a non-empty title.
    return st.builds(
        wire.Notice,
        severity=strategy_for(wire.NoticeSeverity),
        title=texts(min_size=1),
        description=st.none() | texts(),
    )


_SPECIAL: dict[Any, Any] = {
    wire.Notice: _notices,
    wire.SetSessionConfigOptionRequest: _set_config_option_requests,
    wire.CreateElicitationRequest: _elicitation_requests,
    wire.ElicitationContentValue: _content_values,
    int | str | None: _request_ids,
}


def content_blocks() -> st.SearchStrategy[wire.ContentBlock]:
    """Any content block: text, image, audio, resource link or embedded resource."""
    return strategy_for(wire.ContentBlock)


def text_blocks() -> st.SearchStrategy[wire.TextContent]:
    """Plain text blocks, the kind every agent accepts in a prompt."""
    return st.builds(wire.TextContent, text=texts(max_size=200))


def session_updates() -> st.SearchStrategy[wire.SessionUpdate]:
    """Any stable ``session/update`` variant."""
    return strategy_for(wire.SessionUpdate)


def session_notifications() -> st.SearchStrategy[wire.SessionNotification]:
    """Whole ``session/update`` params."""
    return strategy_for(wire.SessionNotification)


def mcp_servers() -> st.SearchStrategy[wire.McpServer]:
    """MCP server definitions of every transport (http, sse, stdio)."""
    return strategy_for(wire.McpServer)


def _calls(table: Any, part: str) -> st.SearchStrategy[tuple[str, Any]]:
    pairs = [
        st.tuples(st.just(method), strategy_for(getattr(spec, part)))
        for method, spec in sorted(table.items())
        if getattr(spec, part) is not None
    ]
    return st.one_of(pairs)


def agent_requests() -> st.SearchStrategy[tuple[str, Any]]:
    """``(method, params)`` of any method a client sends to the agent."""
    return _calls(wire.AGENT_METHODS, "params")


def agent_results() -> st.SearchStrategy[tuple[str, Any]]:
    """``(method, result)`` the agent answers a client request with."""
    return _calls(wire.AGENT_METHODS, "result")


def client_requests() -> st.SearchStrategy[tuple[str, Any]]:
    """``(method, params)`` of any method the agent sends to the client."""
    return _calls(wire.CLIENT_METHODS, "params")


def client_results() -> st.SearchStrategy[tuple[str, Any]]:
    """``(method, result)`` a client answers the agent's requests with."""
    return _calls(wire.CLIENT_METHODS, "result")
