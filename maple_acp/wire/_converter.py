"""The one converter between wire types and JSON, and the functions the other layers call.

This module is the wire's one converter: every structuring and unstructuring rule of the wire
types.

Rules it enforces, in one place:

* keys are camelCase; the ``meta`` attribute is ACP's ``_meta`` and passes through untouched;
* ``None`` is never written: an optional field that is ``None`` is left out;
* unknown input keys are ignored, so they can never be echoed back;
* primitives are strict (a number is not a string, a boolean is not a number);
* each tagged union is registered explicitly with its tag key and members, so an unknown tag is
  reported as such instead of as a failed guess among the members;
* a structuring failure becomes one bounded ``-32602`` message naming the field path.
"""

import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal, TypeVar, overload

import attrs
import orjson
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.orjson import OrjsonConverter, make_converter

from . import _content as c
from . import _initialize as ini
from . import _interaction as i
from . import _session as s
from . import _updates as u
from . import _v2 as v2
from ._naming import wire_key
from ._validators import WireValueError
from .errors import INVALID_PARAMS, ProtocolError

T = TypeVar("T")

#: A quoted tag or key in an error message is cut to this length: enough to recognise, never a
#: place to smuggle a long value back to the peer or into a log.
MAX_QUOTED_CHARS: Final = 40

_MISSING: Final = object()


def _quote(value: object) -> str:
    text = value if isinstance(value, str) else type(value).__name__
    if len(text) > MAX_QUOTED_CHARS:
        text = text[: MAX_QUOTED_CHARS - 1] + "…"
    return repr(text)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _expected(what: str, value: object) -> WireValueError:
    return WireValueError(f"expected {what}, got {_type_name(value)}")


# --- strict primitives -------------------------------------------------------------------------


def _structure_str(value: object, _: object) -> str:
    if isinstance(value, str):
        return value
    raise _expected("a string", value)


def _structure_int(value: object, _: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _expected("an integer", value)


def _structure_float(value: object, _: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise _expected("a number", value)


def _structure_bool(value: object, _: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _expected("a boolean", value)


def _structure_json_object(value: object, _: object) -> dict[str, Any]:
    # ``_meta`` and other open objects: kept as the very dict that was parsed.
    if isinstance(value, dict):
        return value
    raise _expected("an object", value)


def _identity(value: T) -> T:
    return value


def _is_literal(tp: object) -> bool:
    return typing.get_origin(tp) is Literal


def _literal_hook(tp: Any) -> Callable[[object, object], object]:
    allowed = typing.get_args(tp)
    expected = "one of " + ", ".join(repr(a) for a in allowed)

    def structure(value: object, _: object) -> object:
        if isinstance(value, str) and value in allowed:
            return value
        raise WireValueError(f"expected {expected}")

    return structure


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _is_optional(tp: object) -> bool:
    if not _is_union(tp):
        return False
    args = typing.get_args(tp)
    return len(args) == 2 and type(None) in args


def _is_homogeneous_tuple(tp: object) -> bool:
    args = typing.get_args(tp)
    return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_str_keyed_dict(tp: object) -> bool:
    args = typing.get_args(tp)
    return typing.get_origin(tp) is dict and len(args) == 2 and args[0] is str


def _equals(expected: object) -> Callable[[object], bool]:
    return lambda tp: tp == expected


def _is_wire_class(tp: object) -> bool:
    return isinstance(tp, type) and attrs.has(tp)


def _configure(converter: OrjsonConverter) -> None:
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook_factory(_is_literal, _literal_hook)

    def optional_hook(tp: Any) -> Callable[[object, object], object]:
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        handler = converter.get_structure_hook(inner)

        def structure(value: object, _: object) -> object:
            return None if value is None else handler(value, inner)

        return structure

    converter.register_structure_hook_factory(_is_optional, optional_hook)

    def tuple_hook(tp: Any) -> Callable[[object, object], tuple[Any, ...]]:
        item_type = typing.get_args(tp)[0]
        handler = converter.get_structure_hook(item_type)

        def structure(value: object, _: object) -> tuple[Any, ...]:
            if not isinstance(value, list | tuple):
                raise _expected("an array", value)
            items = []
            for index, item in enumerate(value):
                try:
                    items.append(handler(item, item_type))
                except Exception as exc:
                    note = IterableValidationNote(f"item {index}", index, item_type)
                    exc.__notes__ = [*getattr(exc, "__notes__", ()), note]
                    raise IterableValidationError("invalid item", [exc], tp) from None
            return tuple(items)

        return structure

    converter.register_structure_hook_factory(_is_homogeneous_tuple, tuple_hook)

    def dict_hook(tp: Any) -> Callable[[object, object], dict[str, Any]]:
        value_type = typing.get_args(tp)[1]
        if value_type is Any:
            return _structure_json_object
        handler = converter.get_structure_hook(value_type)

        def structure(value: object, _: object) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise _expected("an object", value)
            result = {}
            for key, item in value.items():
                try:
                    result[key] = handler(item, value_type)
                except Exception as exc:
                    note = IterableValidationNote(f"key {key!r}", str(key), value_type)
                    exc.__notes__ = [*getattr(exc, "__notes__", ()), note]
                    raise IterableValidationError("invalid value", [exc], tp) from None
            return result

        return structure

    converter.register_structure_hook_factory(_is_str_keyed_dict, dict_hook)
    # Open objects (``_meta``, goal budgets) are written as they are, not copied key by key.
    converter.register_unstructure_hook_func(lambda tp: tp == dict[str, Any], _identity)

    def lenient(field: "attrs.Attribute[Any]") -> Callable[[object, object], object]:
        handler = converter.get_structure_hook(field.type)
        default = field.default

        def structure(value: object, _: object) -> object:
            try:
                return handler(value, field.type)
            except Exception:
                # Every lenient field has a plain default: None, False, () or a capability
                # object, none of them a factory.
                return default

        return structure

    def class_structure_hook(cls: Any) -> Callable[[object, object], Any]:
        lenient_fields = _LENIENT_FIELDS.get(cls, frozenset())
        renames = {
            a.name: override(
                rename=wire_key(a.name),
                struct_hook=lenient(a) if a.name in lenient_fields or a.name == "meta" else None,
            )
            for a in attrs.fields(cls)
        }
        generated = make_dict_structure_fn(
            cls,
            converter,
            _cattrs_forbid_extra_keys=False,
            _cattrs_detailed_validation=True,
            **renames,  # type: ignore[arg-type]  # attribute overrides share the kwargs
        )

        def structure(value: object, _: object) -> Any:
            if not isinstance(value, dict):
                raise _expected("an object", value)
            return generated(value, cls)

        return structure

    def class_unstructure_hook(cls: type[Any]) -> Callable[[Any], dict[str, Any]]:
        # Only a field whose default is None may be left out, and only while it is None; a
        # ``False`` capability is still written because clients read it.
        always = _NULL_WRITTEN_FIELDS.get(cls, frozenset())
        renames = {
            a.name: override(
                rename=wire_key(a.name),
                omit_if_default=a.default is None and a.name not in always,
            )
            for a in attrs.fields(cls)
        }
        return make_dict_unstructure_fn(cls, converter, **renames)  # type: ignore[arg-type]

    converter.register_structure_hook_factory(_is_wire_class, class_structure_hook)
    converter.register_unstructure_hook_factory(_is_wire_class, class_unstructure_hook)

    for union in _TAGGED_UNIONS:
        union.register(converter)
    for union_type, structure in _UNTAGGED_UNIONS.items():
        # A predicate hook, so it outranks the preconf converter's primitive-union passthrough.
        converter.register_structure_hook_func(_equals(union_type), structure)


# --- leniency ---------------------------------------------------------------------------------


def _all_fields(cls: type) -> tuple[type, frozenset[str]]:
    return cls, frozenset(a.name for a in attrs.fields(cls))


#: Fields written as ``null`` rather than left out when they are ``None``: the schema allows
#: both, but a client may tell the two apart (Toad shows a new file's diff only when
#: ``oldText`` is present and ``null``).
_NULL_WRITTEN_FIELDS: Final[dict[type, frozenset[str]]] = {u.Diff: frozenset({"old_text"})}
#: Fields that fall back to their default when malformed, as the schema's
#: ``x-deserialize-default-on-error`` asks. Applied where an error would only lock a peer out
#: (capability negotiation and implementation info); ``_meta`` is lenient everywhere. Fields that
#: steer what the agent does (session requests, prompts, answers) stay strict.
_LENIENT_FIELDS: Final[dict[type, frozenset[str]]] = dict(
    [
        (ini.InitializeRequest, frozenset({"client_capabilities", "client_info"})),
        (ini.InitializeResponse, frozenset({"agent_capabilities", "auth_methods", "agent_info"})),
        (ini.Implementation, frozenset({"title"})),
        (ini.AuthMethod, frozenset({"description"})),
        *(
            _all_fields(cls)
            for cls in (
                ini.ClientCapabilities,
                ini.FileSystemCapabilities,
                ini.ClientSessionCapabilities,
                ini.SessionConfigOptionsCapabilities,
                ini.NoticeCapabilities,
                ini.CompactionCapabilities,
                ini.AuthCapabilities,
                ini.ElicitationCapabilities,
                ini.AgentCapabilities,
                ini.PromptCapabilities,
                ini.McpCapabilities,
                ini.SessionCapabilities,
                ini.AgentAuthCapabilities,
            )
        ),
    ]
)


# --- tagged and untagged unions ----------------------------------------------------------------


@attrs.frozen
class _TaggedUnion:
    """A union whose members are told apart by the string under ``key``."""

    union: Any
    noun: str
    key: str
    members: Mapping[str, type]
    #: The member chosen when ``key`` is absent (stdio MCP servers carry no ``type``).
    untagged: type | None = None

    def register(self, converter: OrjsonConverter) -> None:
        by_class = {cls: tag for tag, cls in self.members.items()}
        if self.untagged is not None:
            by_class[self.untagged] = None  # type: ignore[assignment]
        key, members, untagged, noun = self.key, self.members, self.untagged, self.noun

        def structure(value: object, _: object) -> object:
            if not isinstance(value, dict):
                raise _expected("an object", value)
            tag = value.get(key, _MISSING)
            if tag is _MISSING:
                if untagged is None:
                    raise WireValueError("missing required field", field=key)
                cls = untagged
            elif not isinstance(tag, str):
                raise WireValueError(f"expected a string, got {_type_name(tag)}", field=key)
            else:
                found = members.get(tag)
                if found is None:
                    raise WireValueError(f"unknown {noun} {_quote(tag)}", field=key)
                cls = found
            return converter.get_structure_hook(cls)(value, cls)

        def unstructure(obj: object) -> dict[str, Any]:
            cls = type(obj)
            try:
                tag = by_class[cls]
            except KeyError:
                raise TypeError(f"{cls.__name__} is not a member of {noun}") from None
            body: dict[str, Any] = converter.get_unstructure_hook(cls)(obj)
            return body if tag is None else {key: tag, **body}

        converter.register_structure_hook_func(_equals(self.union), structure)
        converter.register_unstructure_hook(self.union, unstructure)


_TAGGED_UNIONS: Final = (
    _TaggedUnion(
        union=c.ContentBlock,
        noun="content block type",
        key="type",
        members={
            "text": c.TextContent,
            "image": c.ImageContent,
            "audio": c.AudioContent,
            "resource_link": c.ResourceLink,
            "resource": c.EmbeddedResource,
        },
    ),
    _TaggedUnion(
        union=s.McpServer,
        noun="MCP server type",
        key="type",
        members=s.MCP_SERVER_TYPES,
        untagged=s.McpServerStdio,
    ),
    _TaggedUnion(
        union=v2.V2McpServer,
        noun="MCP server type",
        key="type",
        members=v2.V2_MCP_SERVER_TYPES,
        untagged=s.McpServerStdio,
    ),
    _TaggedUnion(
        union=u.ToolCallContent,
        noun="tool call content type",
        key="type",
        members={"content": u.Content, "diff": u.Diff},
    ),
    _TaggedUnion(
        union=u.SessionUpdate,
        noun="session update",
        key="sessionUpdate",
        members={
            "user_message_chunk": u.UserMessageChunk,
            "agent_message_chunk": u.AgentMessageChunk,
            "agent_thought_chunk": u.AgentThoughtChunk,
            "tool_call": u.ToolCall,
            "tool_call_update": u.ToolCallUpdate,
            "plan": u.Plan,
            "plan_update": u.PlanUpdate,
            "plan_removed": u.PlanRemoved,
            "available_commands_update": u.AvailableCommandsUpdate,
            "config_option_update": u.ConfigOptionUpdate,
            "current_mode_update": u.CurrentModeUpdate,
            "session_info_update": u.SessionInfoUpdate,
            "usage_update": u.UsageUpdate,
            "notice": u.Notice,
            "compaction_update": u.CompactionUpdate,
            "compaction_summary_chunk": u.CompactionSummaryChunk,
        },
    ),
    _TaggedUnion(
        union=i.RequestPermissionOutcome,
        noun="permission outcome",
        key="outcome",
        members={
            "selected": i.SelectedPermissionOutcome,
            "cancelled": i.CancelledPermissionOutcome,
        },
    ),
    _TaggedUnion(
        union=i.CreateElicitationResponse,
        noun="elicitation action",
        key="action",
        members={
            "accept": i.ElicitationAccept,
            "decline": i.ElicitationDecline,
            "cancel": i.ElicitationCancel,
        },
    ),
)


def _structure_resource_contents(value: object, _: object) -> object:
    # The schema distinguishes text from blob contents only by which key is present.
    if not isinstance(value, dict):
        raise _expected("an object", value)
    cls: type = c.TextResourceContents if "text" in value else c.BlobResourceContents
    if "text" not in value and "blob" not in value:
        raise WireValueError("expected a 'text' or a 'blob' field")
    return CONVERTER.get_structure_hook(cls)(value, cls)


def _structure_config_value(value: object, _: object) -> str | bool:
    if isinstance(value, str | bool):
        return value
    raise _expected("a string or a boolean", value)


def _structure_request_id(value: object, _: object) -> int | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _expected("an integer, a string or null", value)


def _structure_content_value(value: object, _: object) -> object:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise _expected("a string, a number, a boolean or an array of strings", value)


_UNTAGGED_UNIONS: Final[dict[Any, Callable[[object, object], object]]] = {
    c.ResourceContents: _structure_resource_contents,
    str | bool: _structure_config_value,
    int | str | None: _structure_request_id,
    i.ElicitationContentValue: _structure_content_value,
}


def _build() -> OrjsonConverter:
    converter = make_converter(
        detailed_validation=True,
        unstruct_collection_overrides={tuple: list},
    )
    _configure(converter)
    return converter


#: The one converter. Other layers call the functions below rather than this object.
CONVERTER: Final = _build()


# --- the public functions ----------------------------------------------------------------------


def _describe(exc: BaseException) -> tuple[str, str, int]:
    """The field path, a reason and the count of failures found under ``exc``."""
    if isinstance(exc, ClassValidationError | IterableValidationError):
        first = exc.exceptions[0]
        segment = ""
        for note in getattr(first, "__notes__", ()):
            if isinstance(note, AttributeValidationNote):
                segment = "." + _segment(wire_key(note.name))
            elif isinstance(note, IterableValidationNote):
                index = note.index
                segment = f"[{index}]" if isinstance(index, int) else "." + _segment(index)
        path, reason, count = _describe(first)
        return segment + path, reason, count + len(exc.exceptions) - 1
    if isinstance(exc, WireValueError):
        return ("." + _segment(exc.field) if exc.field else ""), exc.reason, 1
    if isinstance(exc, KeyError):
        return "", "missing required field", 1
    return "", "invalid value", 1


def _segment(key: str) -> str:
    return key if len(key) <= MAX_QUOTED_CHARS else key[: MAX_QUOTED_CHARS - 1] + "…"


def _invalid_params(exc: BaseException) -> ProtocolError:
    path, reason, count = _describe(exc)
    where = path.lstrip(".")
    message = f"invalid params: {where}: {reason}" if where else f"invalid params: {reason}"
    if count > 1:
        more = count - 1
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    return ProtocolError(INVALID_PARAMS, message)


@overload
def structure_params(params: object, cls: type[T]) -> T: ...
@overload
def structure_params(params: object, cls: object) -> Any: ...
def structure_params(params: object, cls: Any) -> Any:
    """Build ``cls`` from JSON-RPC params (or a result), or raise ``ProtocolError(-32602)``.

    Absent params (``None``) count as an empty object, so a method whose fields are all
    optional accepts them and any other reports its first missing field. The message names the
    failing field path, e.g. ``invalid params: prompt[2].type: unknown content block type
    'video'``, and is one bounded line.
    """
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ProtocolError(
            INVALID_PARAMS, f"invalid params: expected an object, got {_type_name(params)}"
        )
    try:
        return CONVERTER.structure(params, cls)
    except (ClassValidationError, IterableValidationError, ValueError, TypeError, KeyError) as exc:
        raise _invalid_params(exc) from None


def unstructure(obj: object, as_type: object = None) -> Any:
    """``obj`` as JSON-ready data: camelCase keys, ``None`` fields left out.

    A member of a tagged union gets its tag only where the union is expected; pass the union as
    ``as_type`` to unstructure a lone member with its tag.
    """
    return CONVERTER.unstructure(obj, unstructure_as=as_type)


def encode(obj: object, as_type: object = None) -> bytes:
    """``obj`` as compact JSON bytes (no trailing newline)."""
    return orjson.dumps(CONVERTER.unstructure(obj, unstructure_as=as_type))


def warm_codecs(modules: Iterable[types.ModuleType]) -> Iterator[None]:
    """Build the structure and unstructure functions of every wire class of ``modules`` now,
    one class per step (the caller yields to other work between steps).

    The converter generates each class's functions on the class's first use; left to that, the
    generation (code built and compiled per class) falls on a host's first requests: tens of
    milliseconds before its first prompt reaches the model. A host runs this once it serves."""
    seen: set[type] = set()
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and attrs.has(value) and value not in seen:
                seen.add(value)
                CONVERTER.get_unstructure_hook(value)
                CONVERTER.get_structure_hook(value)
                yield
