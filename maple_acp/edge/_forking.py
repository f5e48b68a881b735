"""``session/fork`` (unstable schema): a new session with a copy of another's history.

The fork is the runtime's (``AgentService.fork_task``): a provisional task of the caller's with
the source's root, directories, model, mode and thinking level, hidden from ``session/list``
until its first prompt and swept like any provisional session if never prompted. The caller
must be able to load the source (``cwd`` its root; another account's session is as unknown as
a missing one, ``-32002``); a source open on this or another connection may be forked while
idle, not while a turn runs (``-32600``). The copy ends at ``_meta.messageId`` when given
(an unknown id is ``-32602``).

Resource handling: the new session is opened like ``session/new``'s (the connection's session
cap, its MCP servers connected in the lease's nursery first). Error handling: refusals
propagate to the connection's one mapping. Cancellation: a fork cancelled while its lease is
set up leaves nothing registered, and a copy that was not handed out is deleted with its
lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

from maple_acp.edge._opening import SessionOpener
from maple_acp.edge._prompt import mcp_definitions
from maple_acp.mcp import validate_servers
from maple_acp.runtime import AgentService, RelayValues
from maple_acp.wire import INVALID_PARAMS, ForkSessionRequest, ProtocolError

logger = logging.getLogger(__name__)

#: Where a fork request names the message its copy ends at (the schema has no field for it).
UP_TO_META_KEY = "messageId"


def up_to_message(request: ForkSessionRequest) -> str | None:
    """The ``_meta.messageId`` of ``request``, if any; anything but a non-blank string there
    is bad params."""
    if request.meta is None or UP_TO_META_KEY not in request.meta:
        return None
    value = request.meta[UP_TO_META_KEY]
    if not isinstance(value, str) or not value.strip():
        raise ProtocolError(INVALID_PARAMS, f"_meta.{UP_TO_META_KEY}: must be a message id")
    return value


class SessionForker:
    """Serves ``session/fork`` for one connection, through its :class:`SessionOpener`."""

    def __init__(
        self,
        opener: SessionOpener,
        runtime: AgentService,
        allowed_roots: Sequence[str],
        *,
        relay: Callable[[], RelayValues],
    ) -> None:
        self._opener = opener
        self._runtime = runtime
        self._roots = allowed_roots
        self._relay = relay

    async def fork(self, request: ForkSessionRequest) -> object:
        if request.system_prompt is not None:
            # The schema: an agent that cannot apply it must refuse the fork.
            raise ProtocolError(INVALID_PARAMS, "systemPrompt: not supported by this agent")
        up_to = up_to_message(request)
        servers = validate_servers(mcp_definitions(request.mcp_servers))
        # Omitted or empty: the source's directories; else they must be the source's set.
        additional = request.additional_directories or None
        # Decided here, at its admission, before any await: a prompt written just before it
        # holds the slot now, but its run may end while the fork's checks (the roots, the
        # source's record) wait on threads, and the fork must not see the session idle then.
        # The runtime checks again right before the copy.
        self._runtime.check_idle(request.session_id)
        session = await self._opener.open(
            partial(
                self._runtime.fork_task,
                request.session_id,
                cwd=request.cwd,
                up_to=up_to,
                relay=self._relay(),
                router_factory=self._opener.router_factory(servers),
                allowed_roots=self._roots,
                additional_directories=additional,
            )
        )
        logger.info("session %s forked from %s", session.id, request.session_id)
        await self._opener.after_new(session)
        return session.dialect.fork_answer(session.id, session.options(), session.settings())
