"""Questions the agent puts to the client: permission requests and form elicitation."""

from typing import Any, Literal

import attrs

from ._content import Meta
from ._updates import ToolCallUpdate
from ._validators import WireValueError

PermissionOptionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always"]


@attrs.frozen(kw_only=True)
class PermissionOption:
    option_id: str
    name: str
    kind: PermissionOptionKind
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class RequestPermissionRequest:
    session_id: str
    tool_call: ToolCallUpdate
    options: tuple[PermissionOption, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SelectedPermissionOutcome:
    option_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class CancelledPermissionOutcome:
    pass


#: Tagged on ``outcome``: selected, cancelled.
RequestPermissionOutcome = SelectedPermissionOutcome | CancelledPermissionOutcome


@attrs.frozen(kw_only=True)
class RequestPermissionResponse:
    outcome: RequestPermissionOutcome
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class BooleanPropertySchema:
    """A boolean form field: the only kind of field this package asks for (project trust)."""

    type: Literal["boolean"] = "boolean"
    title: str | None = None
    description: str | None = None
    default: bool | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ElicitationSchema:
    type: Literal["object"] = "object"
    title: str | None = None
    description: str | None = None
    properties: dict[str, BooleanPropertySchema] = attrs.field(factory=dict)
    required: tuple[str, ...] | None = None
    meta: Meta | None = None


def _check_scope(instance: "CreateElicitationRequest", attribute: Any, value: Any) -> None:
    # A form is scoped to a session (optionally one tool call) or to one JSON-RPC request.
    if instance.session_id is None and instance.request_id is None:
        raise WireValueError("required unless requestId is given", field="sessionId")
    if instance.session_id is None and instance.tool_call_id is not None:
        raise WireValueError("only allowed with sessionId", field="toolCallId")


@attrs.frozen(kw_only=True)
class CreateElicitationRequest:
    """Params of ``elicitation/create`` in form mode, the only mode this package sends."""

    mode: Literal["form"] = "form"
    message: str
    requested_schema: ElicitationSchema
    session_id: str | None = None
    tool_call_id: str | None = None
    request_id: int | str | None = attrs.field(default=None, validator=_check_scope)
    meta: Meta | None = None


#: One answered form value: string, integer, number, boolean or list of strings.
ElicitationContentValue = str | int | float | bool | tuple[str, ...]


@attrs.frozen(kw_only=True)
class ElicitationAccept:
    content: dict[str, ElicitationContentValue] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ElicitationDecline:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ElicitationCancel:
    meta: Meta | None = None


#: The result of ``elicitation/create``, tagged on ``action``: accept, decline, cancel.
CreateElicitationResponse = ElicitationAccept | ElicitationDecline | ElicitationCancel
