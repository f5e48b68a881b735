"""``LeaseContext``: the narrow surface a lease sees of the service that made it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs

from maple_acp.model import CommandInfo
from maple_acp.runtime._backend import AgentBackend
from maple_acp.runtime._models import ModelChoices
from maple_acp.runtime._modes import ModeSet
from maple_acp.runtime._options import BooleanOption
from maple_acp.runtime._permissions import PermissionPolicy
from maple_acp.store import TaskStore


@attrs.frozen(kw_only=True)
class LeaseContext:
    """What every lease of one service may use. The service builds one and hands it to each
    lease; a lease never sees the service itself, so what it can do is exactly this list."""

    store: TaskStore
    backend: AgentBackend
    policy: PermissionPolicy
    #: Unix milliseconds on the service's clock (moved by trio's clock in tests).
    now_ms: Callable[[], int]
    #: How long a released-but-unclosed provisional task stays loadable.
    provisional_grace_ms: int
    #: Raises the admission kinds unless work may still be admitted under a generation.
    check_admitted: Callable[[int], None]
    #: The same test, without raising.
    admits: Callable[[int], bool]
    #: The model choices of the account of a generation (``refresh`` second).
    model_choices: Callable[[int, bool], Awaitable[ModelChoices]]
    #: The last refreshed listing for a generation's account, without waiting (``None``: no
    #: listing yet, or the last refresh failed).
    known_models: Callable[[int], ModelChoices | None]
    #: Save a project-trust decision for a generation's account, asked from inside a lease:
    #: leases of the project may hold it, only a running turn there makes it ``TRUST_BUSY``.
    set_trust: Callable[[int, str, bool | None], Awaitable[None]]
    #: The lease's cleanup ended: the task (by id) is free for another lease. The lease passes
    #: itself, so that a newer lease of the same task is never forgotten by an older one.
    unregister: Callable[[str, object], None]
    #: The backend's declared commands, bounded, for a new lease.
    declared_commands: Callable[[], tuple[CommandInfo, ...]]
    #: The session modes the host offers.
    modes: ModeSet
    #: The thinking-effort levels the backend declares for a model (checked, maybe none).
    thought_levels: Callable[[str | None], tuple[str, ...]]
    #: The boolean options the backend declares (checked when the service was built).
    boolean_options: tuple[BooleanOption, ...] = ()
    #: The model a child session runs on (``None``: its parent's).
    subagent_model: str | None = None
