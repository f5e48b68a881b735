"""Which params and result types belong to each ACP method, for dispatch and for fuzzing."""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from . import _extensions as x
from . import _initialize as ini
from . import _interaction as i
from . import _session as s
from . import _updates as u


@attrs.frozen(kw_only=True)
class MethodSpec:
    """One method: its params type, and its result type (``None`` for a notification).

    ``params`` and ``result`` are wire classes or tagged unions of them; pass them to
    :func:`structure_params` / :func:`unstructure` as they are.
    """

    method: str
    params: Any
    result: Any = None

    @property
    def is_notification(self) -> bool:
        return self.result is None


def _table(*specs: MethodSpec) -> Mapping[str, MethodSpec]:
    return MappingProxyType({spec.method: spec for spec in specs})


#: Methods a client calls on the agent that this package handles: the edge dispatches from it.
AGENT_METHODS: Final = _table(
    MethodSpec(method="initialize", params=ini.InitializeRequest, result=ini.InitializeResponse),
    MethodSpec(method="session/new", params=s.NewSessionRequest, result=s.NewSessionResponse),
    MethodSpec(method="session/load", params=s.LoadSessionRequest, result=s.LoadSessionResponse),
    MethodSpec(method="session/fork", params=s.ForkSessionRequest, result=s.ForkSessionResponse),
    MethodSpec(
        method="session/resume", params=s.ResumeSessionRequest, result=s.ResumeSessionResponse
    ),
    MethodSpec(
        method="session/delete", params=s.DeleteSessionRequest, result=s.DeleteSessionResponse
    ),
    MethodSpec(method="session/list", params=s.ListSessionsRequest, result=s.ListSessionsResponse),
    MethodSpec(method="session/prompt", params=s.PromptRequest, result=s.PromptResponse),
    MethodSpec(method="session/cancel", params=s.CancelNotification),
    MethodSpec(method="session/close", params=s.CloseSessionRequest, result=s.CloseSessionResponse),
    MethodSpec(
        method="session/set_config_option",
        params=s.SetSessionConfigOptionRequest,
        result=s.SetSessionConfigOptionResponse,
    ),
    MethodSpec(
        method="session/set_mode",
        params=s.SetSessionModeRequest,
        result=s.SetSessionModeResponse,
    ),
    MethodSpec(
        method=x.GOAL_CONTROL_METHOD, params=x.GoalControlRequest, result=x.GoalControlResponse
    ),
    MethodSpec(method=x.STEERING_METHOD, params=x.SteeringRequest, result=x.SteeringResponse),
    MethodSpec(method=x.BACKGROUND_METHOD, params=x.BackgroundRequest, result=x.BackgroundResponse),
    MethodSpec(method=x.QUEUE_METHOD, params=x.QueueRequest, result=x.QueueResponse),
    MethodSpec(method=x.STATUS_METHOD, params=x.StatusRequest, result=x.HostStatus),
    MethodSpec(method=x.TRANSCRIPT_METHOD, params=x.TranscriptRequest, result=x.TranscriptResponse),
    MethodSpec(method=x.BRIDGE_HELLO_METHOD, params=x.BridgeHello),
)

#: Methods the agent calls on the client.
CLIENT_METHODS: Final = _table(
    MethodSpec(method="session/update", params=u.SessionNotification),
    MethodSpec(
        method="session/request_permission",
        params=i.RequestPermissionRequest,
        result=i.RequestPermissionResponse,
    ),
    MethodSpec(
        method="elicitation/create",
        params=i.CreateElicitationRequest,
        result=i.CreateElicitationResponse,
    ),
)

#: Methods either side may send, handled by the JSON-RPC peer itself.
PROTOCOL_METHODS: Final = _table(
    MethodSpec(method="$/cancel_request", params=x.CancelRequestNotification),
)
