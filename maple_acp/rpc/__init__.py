"""JSON-RPC 2.0 over a newline-delimited Trio stream or a message transport: framing,
envelopes, request correlation, outbound credit and ``$/cancel_request``. Knows nothing of ACP
methods.

The sans-I/O core (:class:`LineFramer`, :func:`parse_message`, :class:`PendingRequests`,
:class:`OutboundCredit`, :class:`AdmissionOrder`) is plain Python; :class:`JsonRpcPeer` is the
thin Trio shell.
"""

from ._admission import EVERYTHING, AdmissionOrder
from ._credit import (
    FRAME_OVERHEAD_BYTES,
    MAX_OUTBOUND_BYTES,
    MAX_OUTBOUND_LINES,
    REPLY_RESERVE_BYTES,
    REPLY_RESERVE_LINES,
    OutboundCredit,
)
from ._envelope import (
    MAX_BATCH_MESSAGES,
    ErrorResponse,
    InvalidMessage,
    Message,
    Notification,
    Params,
    Parsed,
    Request,
    RequestId,
    Response,
    check_frame,
    encode_error,
    encode_message,
    encode_notification,
    encode_request,
    encode_result,
    parse_message,
    split_batch,
)
from ._exceptions import ConnectionClosed, FrameTooLong, OutboundFrameTooLarge, RpcError
from ._framing import MAX_LINE_BYTES, LineFramer
from ._handling import (
    NotificationHandler,
    OrderKey,
    RequestHandler,
    admitted,
    after_answer,
    method_not_found,
    request_arrival,
)
from ._inbound import CANCEL_REQUEST_METHOD, MAX_CONCURRENT_REQUESTS
from ._peer import EOF_GRACE_S, JsonRpcPeer
from ._pending import PendingRequests
from ._transport import LineTransport, MessageTransport, Received, Route

__all__ = [
    "CANCEL_REQUEST_METHOD",
    "EOF_GRACE_S",
    "EVERYTHING",
    "FRAME_OVERHEAD_BYTES",
    "MAX_BATCH_MESSAGES",
    "MAX_CONCURRENT_REQUESTS",
    "MAX_LINE_BYTES",
    "MAX_OUTBOUND_BYTES",
    "MAX_OUTBOUND_LINES",
    "REPLY_RESERVE_BYTES",
    "REPLY_RESERVE_LINES",
    "AdmissionOrder",
    "ConnectionClosed",
    "ErrorResponse",
    "FrameTooLong",
    "InvalidMessage",
    "JsonRpcPeer",
    "LineFramer",
    "LineTransport",
    "Message",
    "MessageTransport",
    "Notification",
    "NotificationHandler",
    "OrderKey",
    "OutboundCredit",
    "OutboundFrameTooLarge",
    "Params",
    "Parsed",
    "PendingRequests",
    "Received",
    "Request",
    "RequestHandler",
    "RequestId",
    "Response",
    "Route",
    "RpcError",
    "admitted",
    "after_answer",
    "check_frame",
    "encode_error",
    "encode_message",
    "encode_notification",
    "encode_request",
    "encode_result",
    "method_not_found",
    "parse_message",
    "request_arrival",
    "split_batch",
]
