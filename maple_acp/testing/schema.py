"""Validate frames an ACP agent emits against the official ACP JSON Schema (v1, or the v2
draft when the directory is ``acp-schema/v2``).

Needs ``jsonschema`` (a test dependency). The schema directory comes from an explicit path,
``ACP_SCHEMA_DIR``, ``../shared/acp-schema/v1`` or the cached package
(:mod:`maple_acp.testing.schema_source`, which the test suite uses to fetch it once);
:func:`find_schema_dir` never downloads and returns ``None`` when none holds it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from maple_acp.testing.schema_source import (
    cached_schema_dir,
    resolve_schema_dir,
    shared_schema_dir,
)

#: What each agent-side method answers with, by schema definition.
RESULT_DEFINITIONS: Final[Mapping[str, str]] = {
    "initialize": "InitializeResponse",
    "session/new": "NewSessionResponse",
    "session/load": "LoadSessionResponse",
    "session/fork": "ForkSessionResponse",
    "session/resume": "ResumeSessionResponse",
    "session/delete": "DeleteSessionResponse",
    "session/list": "ListSessionsResponse",
    "session/prompt": "PromptResponse",
    "session/close": "CloseSessionResponse",
    "session/set_config_option": "SetSessionConfigOptionResponse",
    "session/set_mode": "SetSessionModeResponse",
}
#: Definitions that live only in the unstable schema, or stable ones we extend from it
#: (``PromptResponse.usage``).
UNSTABLE_RESULTS: Final = frozenset({"session/prompt", "session/fork"})
#: Requests and notifications an agent sends to a client, by schema definition.
OUTBOUND_DEFINITIONS: Final[Mapping[str, str]] = {
    "session/update": "SessionNotification",
    "session/request_permission": "RequestPermissionRequest",
    "elicitation/create": "CreateElicitationRequest",
    "mcp/message": "MessageMcpRequest",
    # Either side's: a permission question another window answered is withdrawn.
    "$/cancel_request": "CancelRequestNotification",
}
#: Requests an agent sends that only the unstable schema defines (both versions).
UNSTABLE_OUTBOUND: Final = frozenset({"mcp/message"})


#: The prompt queue's notification (this library's extension, outside the ACP schema) and the
#: longest preview an entry carries.
QUEUE_CHANGED_METHOD: Final = "_session/queue_changed"
QUEUE_PREVIEW_CHARS: Final = 200


#: What differs in ACP v2 (``acp-schema/v2``): an update's definition, and methods with
#: no v2 counterpart that a v2 agent must never answer or send.
V2_OUTBOUND_DEFINITIONS: Final[Mapping[str, str]] = {
    "session/update": "UpdateSessionNotification",
    "session/request_permission": "RequestPermissionRequest",
    "mcp/message": "MessageMcpRequest",
    "$/cancel_request": "CancelRequestNotification",
}
V2_UNSTABLE_RESULTS: Final = frozenset({"session/fork"})
#: The definition only the v2 schema has: how a directory without ``meta.json`` is told apart.
V2_UPDATE_DEFINITION: Final = V2_OUTBOUND_DEFINITIONS["session/update"]


class SchemaViolation(AssertionError):
    """A frame does not match the ACP schema."""


def find_schema_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The ACP v1 schema directory, or ``None`` if it is not on this machine."""
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(Path(explicit))
    env = os.environ.get("ACP_SCHEMA_DIR")
    if env:
        candidates.append(Path(env))
    candidates.append(shared_schema_dir())
    candidates.append(cached_schema_dir(os.environ))
    for candidate in candidates:
        if (candidate / "schema.json").is_file():
            return candidate
    return None


def load_acp_schema(version: int = 1) -> AcpSchema:
    """The ACP schema a host's tests check frames against, wherever this library runs: the
    directory :func:`find_schema_dir` finds (``ACP_SCHEMA_DIR`` first), else the pinned npm
    package's copy, downloaded once (its sha256 checked) and cached in the user's cache
    directory (:mod:`maple_acp.testing.schema_source`). ``version`` 2 is the v2 draft beside
    it. Raises :class:`~maple_acp.testing.schema_source.SchemaUnavailable` (one line naming
    ``ACP_SCHEMA_DIR``) when there is no way to get it, e.g. offline with an empty cache."""
    directory = find_schema_dir() or resolve_schema_dir(os.environ)
    if version == 2:
        directory = directory.parent / "v2"
    return AcpSchema(directory)


class AcpSchema:
    """Validators for the definitions of one schema directory (stable + unstable files)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._documents = {
            name: orjson.loads((directory / f"{name}.json").read_bytes())
            for name in ("schema", "schema.unstable")
        }
        self._validators: dict[tuple[str, str], Any] = {}
        meta = directory / "meta.json"
        #: The protocol version the directory describes: its ``meta.json``, else the schema's
        #: own update definition (the npm package's ``schema/`` folder has no meta files).
        if meta.is_file():
            self.version = int(orjson.loads(meta.read_bytes()).get("version", 1))
        else:
            definitions = self._documents["schema"].get("$defs", {})
            self.version = 2 if V2_UPDATE_DEFINITION in definitions else 1

    def _validator(self, document: str, definition: str) -> Any:
        key = (document, definition)
        cached = self._validators.get(key)
        if cached is not None:
            return cached
        import jsonschema  # type: ignore[import-untyped]

        root = self._documents[document]
        if definition not in root["$defs"]:
            raise KeyError(f"{definition} is not defined in {document}.json")
        wrapper = {"$ref": f"#/$defs/{definition}", "$defs": root["$defs"]}
        validator_cls = jsonschema.validators.validator_for(root)
        validator = self._validators[key] = validator_cls(wrapper)
        return validator

    def validate(self, definition: str, instance: Any, *, unstable: bool = False) -> None:
        """Raise :class:`SchemaViolation` if ``instance`` does not match ``definition``."""
        validator = self._validator("schema.unstable" if unstable else "schema", definition)
        errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.path) or "(root)"
            raise SchemaViolation(f"{definition} at {where}: {first.message}")

    def validate_result(self, method: str, result: Any) -> None:
        """Validate an agent's answer to ``method`` (extension methods: any JSON object)."""
        definition = RESULT_DEFINITIONS.get(method)
        if definition is None:
            if not isinstance(result, dict):
                raise SchemaViolation(f"{method} answered a non-object result")
            return
        unstable = V2_UNSTABLE_RESULTS if self.version == 2 else UNSTABLE_RESULTS
        self.validate(definition, result, unstable=method in unstable)

    def validate_error(self, error: Any) -> None:
        self.validate("Error", error)
        message = error["message"]
        if not message or "\n" in message or len(message) > 500:
            raise SchemaViolation(f"error message breaks the error contract: {message!r}")
        # The reason again where some clients look for it (docs/protocol.md, "Errors").
        data = error.get("data")
        if not isinstance(data, dict) or data.get("details") != message:
            raise SchemaViolation(f"error without its reason in data.details: {error!r}"[:500])

    def validate_outbound(self, method: str, params: Any) -> None:
        """Validate a request or notification an agent sends to its client (this library's
        own extension notifications against their documented shape)."""
        if method == QUEUE_CHANGED_METHOD:
            _check_queue_changed(params)
            return
        table = V2_OUTBOUND_DEFINITIONS if self.version == 2 else OUTBOUND_DEFINITIONS
        definition = table.get(method)
        if definition is None:
            raise SchemaViolation(f"agent sent an unexpected method {method!r}")
        self.validate(definition, params, unstable=method in UNSTABLE_OUTBOUND)


def _check_queue_changed(params: Any) -> None:
    """``_session/queue_changed``: ``{sessionId, entries: [{entryId, preview, queuedAt}]}``."""
    if not isinstance(params, dict) or set(params) != {"sessionId", "entries"}:
        raise SchemaViolation(f"{QUEUE_CHANGED_METHOD}: expected sessionId and entries")
    if not isinstance(params["sessionId"], str) or not isinstance(params["entries"], list):
        raise SchemaViolation(f"{QUEUE_CHANGED_METHOD}: sessionId or entries mistyped")
    for entry in params["entries"]:
        if (
            not isinstance(entry, dict)
            or set(entry) != {"entryId", "preview", "queuedAt"}
            or not all(isinstance(value, str) for value in entry.values())
            or len(entry["preview"]) > QUEUE_PREVIEW_CHARS
        ):
            raise SchemaViolation(f"{QUEUE_CHANGED_METHOD}: malformed entry {entry!r:.200}")


def validate_frames(
    schema: AcpSchema,
    frames: Iterable[tuple[str, Any]],
    *,
    methods: Mapping[Any, str] | None = None,
) -> int:
    """Check every message an agent sent against ``schema``; return how many.

    ``frames`` are ``(direction, message)`` pairs in the order they moved: ``"out"`` to the
    agent (its requests name the method each answer is checked against), ``"in"`` from it;
    ``methods`` adds requests sent earlier (id -> method). Answers are validated as the result
    type of the request they answer; error answers against ``Error`` plus the error contract
    (one line, at most 500 chars).
    """
    frames = list(frames)
    methods = dict(methods or {})
    for direction, message in frames:
        if direction != "out":
            continue
        # A batch line (a list) carries requests too.
        for sent in message if isinstance(message, list) else [message]:
            if isinstance(sent, dict) and "method" in sent and "id" in sent:
                methods[sent["id"]] = sent["method"]
    count = 0
    for direction, line in frames:
        if direction != "in":
            continue
        # A batch's answer (v2) is one array of answers.
        if isinstance(line, list) and not line:
            raise SchemaViolation("agent sent an empty array")
        for message in line if isinstance(line, list) else [line]:
            _validate_one(schema, methods, message)
            count += 1
    return count


def _validate_one(schema: AcpSchema, methods: Mapping[Any, str], message: Any) -> None:
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise SchemaViolation(f"agent sent a non-JSON-RPC message: {str(message)[:200]!r}")
    if "method" in message:
        schema.validate_outbound(message["method"], message.get("params"))
    elif "error" in message:
        schema.validate_error(message["error"])
    elif "result" in message:
        method = methods.get(message.get("id"))
        if method is None:
            raise SchemaViolation(f"agent answered an unknown request id {message.get('id')!r}")
        schema.validate_result(method, message["result"])
    else:
        raise SchemaViolation(f"agent sent a frame with no method, result or error: {message}")
