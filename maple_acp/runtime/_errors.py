"""The runtime's one exception hierarchy and the text bound every caller-visible message obeys."""

from __future__ import annotations

import enum

from maple_acp._exceptions import MapleAcpError
from maple_acp._text import MAX_MESSAGE_CHARS as _MAX_MESSAGE_CHARS
from maple_acp._text import one_line

#: Every message that leaves the runtime (rejections, failure text, notices) is one line of at
#: most this many characters, so that no caller has to re-bound it before sending it on.
MAX_MESSAGE_CHARS = _MAX_MESSAGE_CHARS


def bounded_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one non-empty line of at most ``limit`` characters (see ``one_line``)."""
    return one_line(text, limit)


class RejectionKind(enum.Enum):
    """Why the runtime refused an operation. A caller maps each kind to one answer of its own
    (the ACP edge: one JSON-RPC error code per kind)."""

    #: No account is signed in.
    NOT_SIGNED_IN = "not_signed_in"
    #: The operation was captured under an account that has since signed out or changed.
    ACCOUNT_CHANGED = "account_changed"
    #: The service is draining or not serving; no new work is admitted.
    SHUTTING_DOWN = "shutting_down"
    #: The working directory is not an absolute path to an accessible directory.
    INVALID_CWD = "invalid_cwd"
    #: No task with that id exists.
    TASK_NOT_FOUND = "task_not_found"
    #: The task belongs to another account.
    WRONG_ACCOUNT = "wrong_account"
    #: The requested directory is not the task's canonical root.
    ROOT_MISMATCH = "root_mismatch"
    #: The task's permission policy is not the caller-mediated one.
    WRONG_POLICY = "wrong_policy"
    #: The task has an active run.
    RUN_ACTIVE = "run_active"
    #: Another lease holds the task (or is still cleaning up after revocation).
    TASK_LEASED = "task_leased"
    #: The task's persisted model is no longer in the catalog.
    MODEL_RETIRED = "model_retired"
    #: The requested model is not in the catalog.
    UNKNOWN_MODEL = "unknown_model"
    #: The task's model is locked by its first admitted message.
    MODEL_LOCKED = "model_locked"
    #: The requested session mode is not one the host declares.
    UNKNOWN_MODE = "unknown_mode"
    #: The requested thinking effort is not a level the backend declares for the task's model.
    UNKNOWN_THOUGHT_LEVEL = "unknown_thought_level"
    #: A boolean option the backend does not declare, or a value that is not a boolean.
    INVALID_OPTION = "invalid_option"
    #: The lease was revoked or released.
    LEASE_REVOKED = "lease_revoked"
    #: Relay values break the allow-list or the size limits.
    INVALID_RELAY = "invalid_relay"
    #: A list cursor this runtime did not issue.
    INVALID_CURSOR = "invalid_cursor"
    #: A goal objective is blank or too long.
    INVALID_GOAL = "invalid_goal"
    #: The goal action needs a goal (or another status) that the task does not have.
    GOAL_STATE = "goal_state"
    #: A project-trust change while that project's tasks run or are leased.
    TRUST_BUSY = "trust_busy"
    #: A fork names a message the source task does not have.
    UNKNOWN_MESSAGE = "unknown_message"
    #: A prompt's content is refused: a malformed or oversized image or resource, too many
    #: images, or images for a model that does not see them.
    INVALID_PROMPT = "invalid_prompt"
    #: The task is a child session: it is reached only through its parent.
    CHILD_SESSION = "child_session"
    #: A session already has as many observing windows as it takes.
    OBSERVERS_FULL = "observers_full"


#: The one line every refusal of a child session's id says.
CHILD_SESSION_MESSAGE = "a child session: use its parent"


class RuntimeRejection(MapleAcpError):
    """The runtime refused an operation. ``kind`` says why; ``message`` is one safe line (no
    credentials, no relay values) of at most ``MAX_MESSAGE_CHARS`` characters; ``detail``,
    when given, is more of the same kind of safe text for a caller to show on request (the
    edge sends it as the error's ``data.detail``)."""

    def __init__(self, kind: RejectionKind, message: str, *, detail: str | None = None) -> None:
        self.kind = kind
        self.message = bounded_text(message)
        self.detail = bounded_text(detail) if detail is not None else None
        super().__init__(self.message)

    def __repr__(self) -> str:
        return f"RuntimeRejection({self.kind.name}, {self.message!r})"
