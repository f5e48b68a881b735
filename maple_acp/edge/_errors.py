"""The one place where runtime and MCP refusals become JSON-RPC errors."""

from __future__ import annotations

from typing import Final

from maple_acp.mcp import ExternalMcpError
from maple_acp.runtime import RejectionKind, RuntimeRejection
from maple_acp.wire import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    RESOURCE_NOT_FOUND,
    ProtocolError,
)

#: The error contract (docs/protocol.md): -32602 bad params, -32600 state conflicts, -32002
#: unknown or not-owned session, -32603 when the runtime cannot serve at all.
REJECTION_CODES: Final[dict[RejectionKind, int]] = {
    RejectionKind.INVALID_CWD: INVALID_PARAMS,
    RejectionKind.INVALID_RELAY: INVALID_PARAMS,
    RejectionKind.INVALID_CURSOR: INVALID_PARAMS,
    RejectionKind.INVALID_GOAL: INVALID_PARAMS,
    RejectionKind.UNKNOWN_MODEL: INVALID_PARAMS,
    RejectionKind.MODEL_LOCKED: INVALID_PARAMS,
    RejectionKind.MODEL_RETIRED: INVALID_PARAMS,
    RejectionKind.UNKNOWN_MODE: INVALID_PARAMS,
    RejectionKind.UNKNOWN_THOUGHT_LEVEL: INVALID_PARAMS,
    RejectionKind.INVALID_OPTION: INVALID_PARAMS,
    RejectionKind.UNKNOWN_MESSAGE: INVALID_PARAMS,
    RejectionKind.INVALID_PROMPT: INVALID_PARAMS,
    RejectionKind.CHILD_SESSION: INVALID_PARAMS,
    RejectionKind.RUN_ACTIVE: INVALID_REQUEST,
    RejectionKind.TASK_LEASED: INVALID_REQUEST,
    RejectionKind.OBSERVERS_FULL: INVALID_REQUEST,
    RejectionKind.WRONG_POLICY: INVALID_REQUEST,
    RejectionKind.GOAL_STATE: INVALID_REQUEST,
    RejectionKind.TRUST_BUSY: INVALID_REQUEST,
    RejectionKind.LEASE_REVOKED: RESOURCE_NOT_FOUND,
    RejectionKind.TASK_NOT_FOUND: RESOURCE_NOT_FOUND,
    RejectionKind.WRONG_ACCOUNT: RESOURCE_NOT_FOUND,
    RejectionKind.ROOT_MISMATCH: INVALID_PARAMS,
    RejectionKind.NOT_SIGNED_IN: INTERNAL_ERROR,
    RejectionKind.ACCOUNT_CHANGED: INTERNAL_ERROR,
    RejectionKind.SHUTTING_DOWN: INTERNAL_ERROR,
}


def protocol_error(exc: RuntimeRejection | ExternalMcpError) -> ProtocolError:
    """The JSON-RPC error for a refusal. Both kinds of message are already one safe line
    (no headers, no URL credentials, no relay values)."""
    if isinstance(exc, RuntimeRejection):
        data = None if exc.detail is None else {"detail": exc.detail}
        return ProtocolError(REJECTION_CODES[exc.kind], exc.message, data)
    return ProtocolError(INVALID_PARAMS, exc.message)


def unknown_session() -> ProtocolError:
    return ProtocolError(RESOURCE_NOT_FOUND, "unknown session, or not owned by this connection")
